"""Exact neighbours (``ProtocolConfig.exact_neighbours``): does an M_exp trained to see, marked, another trajectory's
copy of its own transition copy the real pages in the dream, where such copies exist for every recorded step of a
real task?

    .venv/bin/python benchmarks/exact_neighbours.py --bench runs/bench --seeds 0 1 2 --work runs/exactnb \\
        --out benchmarks/results/exact_neighbours.json

For each bench seed dir (``dreamgym bench`` output: its offline data, replay buffer, M_exp and SFT policy), two
M_exp arms on the same data, protocol and steps:

* ``plain``: the seed's own M_exp (``experience_model/``: trained with ``exact_neighbours`` off, the default then);
* ``exact``: the same training (the seed's ``demo_config.yaml``: model, protocol, SFT settings, mixture, seed) with
  ``exact_neighbours: true``, into ``WORK/seed<k>/exp`` (on a copy of the seed's buffer).

Each arm is scored twice:

* ``wm2real``: the seed's SFT policy plays ``--episodes`` greedy dreamt episodes on the first distinct *train* tasks
  of the offline data (the tasks the dream trains on), and each is replayed in the real shop
  (:func:`dreamgym.rl.wm2real.wm2real`): how often the real env accepts the dreamt actions and the endings agree;
* ``fidelity``: the teacher-forced report on the seed's held-out test-task transitions (``heldout_annotated.jsonl``;
  no exact neighbour exists there but for steps every task shares), to check the option costs nothing where it
  cannot help.

``--part count`` counts, on each seed's offline data, the training examples that see a neighbour headed as the same
step and those whose target is then its whole page, with the option off and on. ``--part dream`` then trains the DreamGym row again with the ``exact`` M_exp: the seed's SFT policy, GRPO in the
dream with the seed's own ``rl``, ``dream`` and ``dream_iterations`` settings (as ``dreamgym demo`` runs its
``dreamgym`` stage), into ``WORK/seed<k>/dreamgym``, and pairs its 200 test episodes task by task with the seed's SFT
and DreamGym rows (their ``eval_tasks.json``): the same policy start, data and RL settings; only M_exp differs.

Results go to ``--out`` cell by cell (a rerun skips the cells it holds).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

FIDELITY = ("done_accuracy", "done_majority_baseline", "terminal_reward_accuracy", "terminal_reward_majority_baseline",
            "reward_consistency", "click_consistency", "invalid_output_rate", "next_state_exact", "next_state_f1")


def train_exact(seed_dir: Path, run: Path) -> Path:
    from dreamgym.experience.protocol import ProtocolConfig
    from dreamgym.experience.train import train_experience_model
    from dreamgym.pipeline import DemoConfig
    from dreamgym.sft import SFTConfig

    exp_dir = run / "exp"
    if (exp_dir / "config.json").is_file():
        return exp_dir
    cfg = DemoConfig(**yaml.safe_load((seed_dir / "demo_config.yaml").read_text()))
    if not (run / "buffer").is_dir():
        shutil.copytree(seed_dir / "buffer", run / "buffer", ignore=shutil.ignore_patterns("lock"))
    train_experience_model([seed_dir / "offline_annotated.jsonl"], cfg.exp_model, exp_dir,
                           ProtocolConfig(**{**cfg.exp_protocol, "exact_neighbours": True}), SFTConfig(**cfg.exp_sft),
                           buffer_dir=run / "buffer", mixture=cfg.exp_mixture, seed=cfg.seed)
    return exp_dir


def score(exp_dir: Path, buffer_dir: Path, seed_dir: Path, episodes: int) -> dict[str, Any]:
    from dreamgym.agent.policy import load_policy
    from dreamgym.experience.fidelity import evaluate_experience_model
    from dreamgym.experience.model import ExperienceModel
    from dreamgym.replay import ReplayBuffer
    from dreamgym.rl.wm2real import policy_wm2real
    from dreamgym.types import read_trajectories

    buffer = ReplayBuffer.open(buffer_dir, create=False, read_only=True)
    exp = ExperienceModel.load(exp_dir, buffer=buffer)
    t0 = time.monotonic()
    train = [t for t in read_trajectories(seed_dir / "offline_annotated.jsonl") if t.transitions]
    w = policy_wm2real(exp, load_policy(seed_dir / "sft"), train, episodes, seed=0, max_steps=15)
    t1 = time.monotonic()
    report = evaluate_experience_model(exp, list(read_trajectories(seed_dir / "heldout_annotated.jsonl")), seed=0)
    return {"wm2real": w, "fidelity": {k: report.get(k) for k in FIDELITY}, "parse": report.get("parse_failures"),
            "wm2real_seconds": round(t1 - t0, 1), "fidelity_seconds": round(time.monotonic() - t1, 1)}


def count_exact(seed_dir: Path) -> dict[str, Any]:
    """How many of the seed's M_exp training examples see a neighbour headed as the same step, and how many of
    those targets are then that neighbour's whole page (``@n1:1-``), with the option off and on."""
    from dreamgym.experience.protocol import SAME_STEP, ProtocolConfig
    from dreamgym.experience.train import exp_pairs
    from dreamgym.pipeline import DemoConfig
    from dreamgym.replay import ReplayBuffer
    from dreamgym.types import read_trajectories

    cfg = DemoConfig(**yaml.safe_load((seed_dir / "demo_config.yaml").read_text()))
    trajs = [t for t in read_trajectories(seed_dir / "offline_annotated.jsonl") if t.transitions]
    buffer = ReplayBuffer.open(seed_dir / "buffer", create=False, read_only=True)
    out: dict[str, Any] = {"examples": sum(len(t.transitions) for t in trajs)}
    for on in (False, True):
        protocol = ProtocolConfig(**{**cfg.exp_protocol, "exact_neighbours": on})
        pairs = exp_pairs(trajs, protocol, buffer)
        marked = [ex for _, ex in pairs if SAME_STEP in str(ex.prompt)]
        out["exact" if on else "plain"] = {"marked": len(marked),
                                           "marked_whole_page": sum("@n1:1-" in ex.target for ex in marked),
                                           "whole_page": sum("@n1:1-" in ex.target for _, ex in pairs)}
    return out


def wm2real_by_origin(rollouts: Path, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The last iteration's dreamt episodes replayed in the real shop, apart by task origin: ``seed`` (a train task,
    which the offline data played) and ``synthetic`` (the curriculum's variations, which it did not)."""
    from dreamgym.envs import make
    from dreamgym.rl.wm2real import wm2real
    from dreamgym.types import read_trajectories

    last = sorted(rollouts.glob("iter_*.jsonl"))[-1]
    trajs = list(read_trajectories(last))
    return {origin: wm2real(group, lambda: make("shop", **env_kwargs))
            for origin in sorted({t.task.origin for t in trajs})
            if (group := [t for t in trajs if t.task.origin == origin])}


def dream(seed_dir: Path, run: Path) -> dict[str, Any]:
    """The seed's DreamGym stage (``dreamgym.pipeline.run_demo``'s ``dream("dreamgym")``) with the exact M_exp."""
    from dreamgym.pipeline import DemoConfig, dream_overrides, rl_config
    from dreamgym.rl.evaluate import EVAL_TASKS
    from dreamgym.rl.trainer import train

    cfg = DemoConfig(**yaml.safe_load((seed_dir / "demo_config.yaml").read_text()))
    if not (run / "dream_buffer").is_dir():
        shutil.copytree(run / "buffer", run / "dream_buffer", ignore=shutil.ignore_patterns("lock"))
    rl_cfg = rl_config(cfg, dream_overrides(cfg, seed_dir / "sft", run / "exp", run / "dream_buffer",
                                            seed_dir / "offline.jsonl"))
    out = run / "dreamgym"
    s = train(rl_cfg, out, resume=(out / "checkpoint").exists() or (out / "checkpoint.old").exists())
    paired = {}
    def episodes(path: Path) -> dict[tuple[int, str], dict[str, Any]]:  # the final evaluation, by episode and task
        return {(r["episode"], r["task_id"]): r for r in json.loads(path.read_text())["per_task"]}

    ours = episodes(out / EVAL_TASKS)
    for row in ("sft", "dreamgym"):
        theirs = episodes(seed_dir / row / EVAL_TASKS)
        common = sorted(set(ours) & set(theirs))
        paired[row] = {"tasks": len(common),
                       "success_diff": sum(ours[t]["success"] - theirs[t]["success"] for t in common) / len(common),
                       "better": sum(ours[t]["success"] > theirs[t]["success"] for t in common),
                       "worse": sum(ours[t]["success"] < theirs[t]["success"] for t in common)}
    return {"success_rate": s["success_rate"], "mean_reward": s["mean_reward"], "seconds": s["seconds"],
            "synthetic_transitions": s.get("synthetic_transitions", 0), "evals": s["evals"],
            "wm2real": s.get("wm2real"), "wm2real_by_origin": wm2real_by_origin(out / "rollouts", cfg.env_kwargs),
            "paired": paired}


ROWS = [("wm2real", "diverged", "dreamt episodes that diverge in the real shop (of 64)"),
        ("wm2real", "reward_agreement", "wm2real reward agreement (±0.1)"),
        ("wm2real", "success_agreement", "wm2real success agreement"),
        ("wm2real", "dreamt_success_rate", "dreamt success"), ("wm2real", "real_success_rate", "real success"),
        *(("fidelity", k, f"test {k.replace('_', ' ')}") for k in FIDELITY)]


def markdown(results: dict[str, Any]) -> None:
    """The README table: each arm's mean over the seeds and the paired exact − plain difference, mean ± 95% t."""
    from pretrained_base import mean_ci

    cells = results["cells"]
    seeds = sorted({c["seed"] for k, c in cells.items() if k.startswith("exact/") and f"plain/{c['seed']}" in cells})
    print(f"| metric (seeds {', '.join(map(str, seeds))}) | plain | exact | exact − plain [95% CI] |")
    print("|---|---|---|---|")
    for part, key, name in ROWS:
        a = [float(cells[f"plain/{s}"][part][key]) for s in seeds]
        b = [float(cells[f"exact/{s}"][part][key]) for s in seeds]
        m, _, hw = mean_ci([y - x for x, y in zip(a, b, strict=True)])
        f = ".1f" if key == "diverged" else ".3f"
        print(f"| {name} | {sum(a) / len(a):{f}} ({', '.join(f'{x:{f}}' for x in a)}) | {sum(b) / len(b):{f}} "
              f"({', '.join(f'{x:{f}}' for x in b)}) | {m:+{f}} [{m - hw:+{f}}, {m + hw:+{f}}] |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", type=Path, default=Path("runs/bench"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--part", choices=["model", "dream", "count"], default="model")
    parser.add_argument("--arms", nargs="+", choices=["plain", "exact"], default=["plain", "exact"])
    parser.add_argument("--episodes", type=int, default=64, help="dreamt episodes (distinct train tasks) per cell")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("runs/exactnb"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/exact_neighbours.json"))
    parser.add_argument("--markdown", action="store_true", help="print the README table of --out and stop")
    args = parser.parse_args()
    if args.markdown:
        markdown(json.loads(args.out.read_text()))
        return

    import torch

    torch.set_num_threads(args.threads)
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results.setdefault("command", "python benchmarks/exact_neighbours.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in vars(args).items()))
    cells = results.setdefault("cells", {})
    for seed in args.seeds:
        seed_dir = args.bench / f"seed{seed}"
        if args.part == "count":
            cells[f"count/{seed}"] = count_exact(seed_dir)
            args.out.write_text(json.dumps(results, indent=1))
            print(f"count/{seed}", json.dumps(cells[f"count/{seed}"]), flush=True)
            continue
        if args.part == "dream":
            key = f"dream/{seed}"
            if key not in cells:
                cells[key] = {"seed": seed, **dream(seed_dir, args.work / f"seed{seed}")}
                args.out.write_text(json.dumps(results, indent=1))
            print(key, json.dumps({k: v for k, v in cells[key].items() if k != "evals"}), flush=True)
            continue
        for arm in args.arms:
            key = f"{arm}/{seed}"
            if key in cells:
                continue
            run = args.work / f"seed{seed}"
            run.mkdir(parents=True, exist_ok=True)
            t0 = time.monotonic()
            if arm == "exact":
                exp_dir, buffer_dir = train_exact(seed_dir, run), run / "buffer"
            else:
                exp_dir, buffer_dir = seed_dir / "experience_model", seed_dir / "buffer"
            train_s = round(time.monotonic() - t0, 1)
            cells[key] = {"arm": arm, "seed": seed, "train_seconds": train_s, **score(exp_dir, buffer_dir, seed_dir,
                                                                                      args.episodes)}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1))
            print(key, json.dumps(cells[key]["wm2real"]), json.dumps(cells[key]["fidelity"]), flush=True)


if __name__ == "__main__":
    main()
