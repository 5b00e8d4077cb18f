"""The behaviour-cloning baseline on the shop: collect noisy-oracle trajectories, SFT a tiny policy for a fixed
number of optimizer steps (a fixed amount of work, ~12 CPU-minutes for the small preset on one thread, so the
result does not depend on how loaded the machine is), then play greedy test episodes; the oracle and the noisy
oracle are scored on the same test episodes for reference.

    .venv/bin/python benchmarks/shop_sft.py [--trajectories 2000] [--preset small] [--max-steps 400]

Prints the numbers and writes benchmarks/results/shop_sft.json (with the command that produced it).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dreamgym.agent.policy import PolicyConfig, load_policy
from dreamgym.baselines.sft import train_bc
from dreamgym.collect import evaluate_scripted, iter_episodes
from dreamgym.envs import make
from dreamgym.envs.pool import env_factory
from dreamgym.rl.evaluate import evaluate_policy
from dreamgym.sft import SFTConfig
from dreamgym.types import write_trajectories

RESULTS = Path(__file__).parent / "results" / "shop_sft.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=2000)
    ap.add_argument("--products", type=int, default=1000)
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--max-steps", type=int, default=400, help="optimizer steps (the cosine schedule's length)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--time-budget", type=float, default=None, help="also stop after this many wall seconds")
    ap.add_argument("--test-episodes", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared machine)")
    ap.add_argument("--action-format", choices=["text", "index"], default="index",
                    help="index: the policy answers an option number (tiny-model default); text: the action itself")
    ap.add_argument("--no-task-search", action="store_true", help="don't offer search[<instruction>] as an option")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/dreamgym_shop_sft"))
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    shutil.rmtree(args.work_dir, ignore_errors=True)
    args.work_dir.mkdir(parents=True)

    env = make("shop", num_products=args.products)
    t0 = time.perf_counter()
    noisy = env.scripted_policy("noisy", seed=0, noise=args.noise)
    trajs = list(iter_episodes(env, noisy, args.trajectories, split="train", seed=0))
    data = args.work_dir / "noisy.jsonl"
    write_trajectories(data, trajs)
    collect_s = time.perf_counter() - t0

    sft_cfg = SFTConfig(max_steps=args.max_steps, learning_rate=args.lr, batch_size=args.batch_size,
                        time_budget_s=args.time_budget, num_threads=args.threads, logging_steps=50, save_steps=10_000)
    cpu0 = time.process_time()
    policy_cfg = PolicyConfig(action_format=args.action_format, offer_task_search=not args.no_task_search)
    summary = train_bc([data], args.preset, args.work_dir / "run", sft_cfg, policy_cfg)
    train_cpu_s = time.process_time() - cpu0

    t0 = time.perf_counter()
    policy = load_policy(args.work_dir / "run")
    factory = env_factory("shop", num_products=args.products)
    bc = evaluate_policy(policy, factory, split="test", episodes=args.test_episodes, seed=0)
    eval_s = time.perf_counter() - t0
    reference: dict[str, Any] = {
        name: evaluate_scripted(env, env.scripted_policy(name, seed=0, **kw), args.test_episodes, split="test").to_dict()
        for name, kw in (("oracle", {}), ("noisy", {"noise": args.noise}))
    }
    result = {
        "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/shop_sft.py", *sys.argv[1:]]),
        "machine": {"cpus_used": args.threads, "processor": platform.processor() or platform.machine()},
        "data": {"trajectories": len(trajs), "success_rate": sum(t.success for t in trajs) / len(trajs),
                 "real_transitions": summary["real_transitions"], "collect_s": round(collect_s, 1)},
        "train": {**{k: summary[k] for k in ("parameters", "examples", "target_tokens", "steps", "epochs",
                                             "train_loss", "seconds")}, "cpu_seconds": round(train_cpu_s, 1)},
        "bc_greedy_test": {**bc.to_dict(), "unparsed_actions": policy.unparsed, "eval_s": round(eval_s, 1)},
        "reference_test": reference,
    }
    print(json.dumps(result, indent=2))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
