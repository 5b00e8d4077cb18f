"""Does RL on the real shop improve an SFT-warm-started tiny policy? (issue 5's done-when measurement)

Stages (each cached in ``--work``, so a rerun skips what is done):

1. offline data: ``--episodes`` noisy-oracle episodes (noise 0.3) on the shop's train split;
2. SFT warm start: behaviour cloning of the successful ones into a fresh ``--preset`` tiny model
   (``dreamgym.baselines.train_bc``);
3. RL: for each algorithm and seed, ``dreamgym.rl.trainer.train`` from the SFT policy on the real shop; every
   run evaluates greedily on the same ``--eval-episodes`` test tasks before training (the SFT start) and at the
   end, and counts the real transitions it trained on.

    .venv/bin/python benchmarks/shop_rl.py --work runs/shop_rl [--algos grpo,ppo] [--seeds 0,1,2]
    # from an existing index-format BC run (benchmarks/shop_sft.py), skipping stages 1-2:
    .venv/bin/python benchmarks/shop_rl.py --work runs/shop_rl --init /tmp/sft_index/run --seeds 0,1 --ppo-seeds 0

Writes benchmarks/results/shop_rl.json (with the command) and prints success before/after, mean ± sd over seeds.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dreamgym.agent.policy import PolicyConfig
from dreamgym.baselines import train_bc
from dreamgym.cli.train import parse_overrides
from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.rl.trainer import RLConfig, train
from dreamgym.sft import SFTConfig
from dreamgym.types import write_trajectories

RESULTS = Path(__file__).parent / "results" / "shop_rl.json"


def offline_data(work: Path, shop: dict[str, Any], episodes: int, noise: float) -> Path:
    path = work / "noisy.jsonl"
    if not path.exists():
        env = make("shop", **shop)
        policy = env.scripted_policy("noisy", seed=0, noise=noise)
        write_trajectories(path, iter_episodes(env, policy, episodes, split="train", seed=0))
    return path


def sft_start(work: Path, data: Path, preset: str, vocab_size: int | None, sft: SFTConfig) -> tuple[Path, dict[str, Any]]:
    run = work / f"sft-{preset}"
    if not (run / "summary.json").exists():
        train_bc([data], preset, run, sft, PolicyConfig(), vocab_size=vocab_size)
    return run, json.loads((run / "summary.json").read_text())


def rl_run(work: Path, sft_run: Path, algo: str, seed: int, base: dict[str, Any]) -> dict[str, Any]:
    run = work / f"{algo}-s{seed}"
    if not (run / "summary.json").exists():
        cfg = RLConfig.model_validate({**base, "algo": algo, "seed": seed, "init": str(sft_run)})
        train(cfg, run, resume=(run / "checkpoint").exists())
    summary: dict[str, Any] = json.loads((run / "summary.json").read_text())
    return summary


def mean_sd(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("runs/shop_rl"))
    ap.add_argument("--preset", default="micro", help="tiny preset of the policy (small is ~3x slower)")
    ap.add_argument("--vocab-size", type=int, default=1024, help="BPE vocabulary (larger: shorter prompts)")
    ap.add_argument("--num-products", type=int, default=1000)
    ap.add_argument("--results-per-page", type=int, default=5)
    ap.add_argument("--episodes", type=int, default=300, help="noisy-oracle episodes for the SFT data")
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--sft-epochs", type=float, default=3.0)
    ap.add_argument("--sft-lr", type=float, default=5e-3)
    ap.add_argument("--algos", default="grpo,ppo")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--ppo-seeds", default=None, help="PPO seeds if not --seeds (PPO is the slower one)")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--tasks-per-iter", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--minibatch-size", type=int, default=128, help="turns per optimizer step")
    ap.add_argument("--max-steps", type=int, default=15, help="episode step limit")
    ap.add_argument("--eval-every", type=int, default=4, help="greedy test evaluation every N iterations")
    ap.add_argument("--eval-episodes", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sft-only", action="store_true", help="stop after the SFT warm start")
    ap.add_argument("--init", type=Path, default=None,
                    help="an existing SFT policy run dir to start from (skips the data and SFT stages)")
    ap.add_argument("--temperature", type=float, default=1.0, help="RL sampling temperature")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="any other RLConfig field, e.g. --set normalize_std=false --set turn_weighting=episode")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    shop = {"num_products": args.num_products, "results_per_page": args.results_per_page}

    t0 = time.monotonic()
    if args.init is not None:
        sft_run = args.init
        sft_summary = json.loads((sft_run / "summary.json").read_text()) if (sft_run / "summary.json").exists() else {}
    else:
        data = offline_data(args.work, shop, args.episodes, args.noise)
        sft_cfg = SFTConfig(epochs=args.sft_epochs, batch_size=32, learning_rate=args.sft_lr, warmup_ratio=0.05,
                            logging_steps=25, save_steps=100, num_threads=args.threads, seed=0)
        sft_run, sft_summary = sft_start(args.work, data, args.preset, args.vocab_size, sft_cfg)
    print(f"SFT warm start: {sft_run} ({sft_summary.get('steps')} steps, loss {sft_summary.get('train_loss')})")
    if args.sft_only:
        return
    base = {
        "env": "shop", "env_kwargs": shop, "iterations": args.iterations, "tasks_per_iter": args.tasks_per_iter,
        "group_size": args.group_size, "lr": args.lr, "temperature": args.temperature, "max_steps": args.max_steps,
        "minibatch_size": args.minibatch_size, "kl_coef": 0.0, "eval_every": args.eval_every,
        "eval_episodes": args.eval_episodes, "save_every": 1, "num_threads": args.threads,
        **parse_overrides(args.overrides),
    }
    runs: dict[str, list[dict[str, Any]]] = {}
    for algo in args.algos.split(","):
        seeds = args.ppo_seeds if algo == "ppo" and args.ppo_seeds is not None else args.seeds
        for seed in (int(s) for s in seeds.split(",")):
            s = rl_run(args.work, sft_run, algo, seed, base)
            start = s["initial_eval"]["success_rate"]
            runs.setdefault(algo, []).append({
                "seed": seed, "sft_success": start, "rl_success": s["success_rate"],
                "gain": s["success_rate"] - start, "sft_reward": s["initial_eval"]["mean_reward"],
                "rl_reward": s["mean_reward"], "sft_invalid_rate": s["initial_eval"]["invalid_action_rate"],
                "rl_invalid_rate": s["evals"][-1]["invalid_action_rate"], "real_transitions": s["real_transitions"],
                "iterations": s["iterations"], "seconds": s["seconds"],
                "evals": [{k: e[k] for k in ("iteration", "real_transitions", "success_rate", "mean_reward")}
                          for e in s["evals"]],
            })
            print(f"{algo} seed {seed}: test success {start:.3f} -> {s['success_rate']:.3f} "
                  f"({s['real_transitions']} real transitions, {s['seconds']:.0f} s)")
    summary = {
        algo: {
            "sft_success": mean_sd([r["sft_success"] for r in rs]),
            "rl_success": mean_sd([r["rl_success"] for r in rs]),
            "gain": mean_sd([r["gain"] for r in rs]),
            "sft_reward": mean_sd([r["sft_reward"] for r in rs]),
            "rl_reward": mean_sd([r["rl_reward"] for r in rs]),
            "minutes": mean_sd([r["seconds"] / 60 for r in rs]),
            "real_transitions": mean_sd([float(r["real_transitions"]) for r in rs]),
        }
        for algo, rs in runs.items()
    }
    for algo, s in summary.items():
        print(f"{algo}: success {s['sft_success']['mean']:.3f} -> {s['rl_success']['mean']:.3f} ± "
              f"{s['rl_success']['sd']:.3f} (gain {s['gain']['mean']:+.3f} ± {s['gain']['sd']:.3f}, n={s['gain']['n']})")
    out = {
        "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv]),
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": args.threads},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "sft": {"run": str(sft_run), **{k: sft_summary.get(k) for k in
                                        ("parameters", "examples", "steps", "train_loss", "real_transitions")}},
        "rl_config": base, "runs": runs, "summary": summary, "seconds": round(time.monotonic() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
