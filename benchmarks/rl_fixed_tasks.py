"""Does GRPO fit the tasks it trains on, and does that carry to unseen tasks? (issue 13: why GRPO-real does not
raise the on-path policy on val)

Per seed, ``--tasks`` train tasks are drawn once and every iteration rolls out ``--group-size`` episodes of each of
them (the trainer draws new tasks every iteration; here they stay fixed), then makes one GRPO update with the
demo's RL settings (Dr.GRPO, episode turn weighting) and ``--lr``, with or without invalid action masking. Greedy
success is measured before and after, on the fixed tasks themselves and on ``--val-episodes`` val tasks, each
paired task by task with the start (the same tasks and reset seeds).

    .venv/bin/python benchmarks/rl_fixed_tasks.py --init runs/onpath/p-s0 --seeds 0 1 2 \\
        --out benchmarks/results/rl_fixed_tasks.json

Writes ``--out`` (with the command): per seed the sampled reward and success on the fixed tasks at every iteration,
and for both task sets the greedy success before and after with the paired difference (95% bootstrap CI over seeds,
then tasks) and the sign test.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dreamgym.agent.policy import LLMPolicy, load_policy, on_policy_config
from dreamgym.envs.pool import LocalEnvPool, env_factory
from dreamgym.pipeline import DemoConfig
from dreamgym.rl.batch import grpo_advantages, turn_rows
from dreamgym.rl.config import RLConfig
from dreamgym.rl.evaluate import eval_tasks
from dreamgym.rl.learner import Learner
from dreamgym.rl.rollout import collect_rollouts
from dreamgym.stats import bootstrap_ci, paired_bootstrap_ci, sign_test
from dreamgym.types import Task

ENV_KWARGS = {"val_fraction": 0.1}


def greedy(policy: LLMPolicy, pool: LocalEnvPool, tasks: list[Task], seed: int) -> list[float]:
    """Greedy success of one episode per task (task k reset with seed + k)."""
    return [float(e.success) for e in collect_rollouts(pool, policy, tasks, group_size=1, greedy=True, seed=seed)]


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    rl = {**DemoConfig().rl, "lr": args.lr, "action_masking": args.masking, "seed": seed}
    cfg = RLConfig.model_validate(rl)
    policy = load_policy(args.init)
    policy.cfg = on_policy_config(policy.cfg, cfg.temperature, cfg.invalid_action_penalty, cfg.top_p,
                                  cfg.action_masking)
    learner = Learner(policy, cfg)
    pool = LocalEnvPool(env_factory("shop", **ENV_KWARGS), num_envs=args.tasks * args.group_size)
    rng = np.random.default_rng(seed)
    train = pool.tasks("train")
    fixed = [train[i] for i in rng.choice(len(train), size=args.tasks, replace=False)]
    val = eval_tasks(pool, "val", args.val_episodes, seed)
    before = {"fixed": greedy(policy, pool, fixed, seed), "val": greedy(policy, pool, val, seed)}
    curve = []
    for it in range(args.iterations):
        episodes = collect_rollouts(pool, policy, fixed, group_size=args.group_size, max_steps=cfg.max_steps,
                                    seed=int(rng.integers(2**31)))
        curve.append({"iteration": it + 1, "reward": float(np.mean([e.env_return for e in episodes])),
                      "success": float(np.mean([e.success for e in episodes])),
                      "invalid_rate": float(np.mean([t.invalid for e in episodes for t in e.turns]))})
        print(f"seed {seed} iter {it + 1}: sampled reward {curve[-1]['reward']:.3f} success {curve[-1]['success']:.3f}",
              flush=True)
        rows = turn_rows(episodes)
        grpo_advantages(episodes, rows, cfg.normalize_std, cfg.turn_weighting, cfg.invalid_penalty_mode)
        learner.update(rows, rng)
    after = {"fixed": greedy(policy, pool, fixed, seed), "val": greedy(policy, pool, val, seed)}
    pool.close()
    return {"seed": seed, "fixed_tasks": [t.task_id for t in fixed], "curve": curve, "before": before, "after": after}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", type=Path, required=True, help="the policy every seed starts from")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tasks", type=int, default=8, help="fixed train tasks per seed")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--no-masking", dest="masking", action="store_false", help="sample freely (default: masked)")
    ap.add_argument("--val-episodes", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not (args.init / "policy.json").is_file():
        raise SystemExit(f"error: {args.init} is not a policy run dir (no policy.json)")
    torch.set_num_threads(args.threads)
    seeds = [run_seed(args, s) for s in args.seeds]
    result: dict[str, Any] = {"command": shlex.join(["python", *sys.argv]), "init": str(args.init),
                              "env_kwargs": ENV_KWARGS, "tasks": args.tasks, "group_size": args.group_size,
                              "iterations": args.iterations, "lr": args.lr, "action_masking": args.masking,
                              "rl": DemoConfig().rl, "seeds": seeds}
    for part in ("fixed", "val"):
        b, a = [s["before"][part] for s in seeds], [s["after"][part] for s in seeds]
        result[part] = {"before": bootstrap_ci(b), "after": bootstrap_ci(a), "after_minus_before": paired_bootstrap_ci(a, b),
                        "sign_test_p": sign_test([x for s in a for x in s], [x for s in b for x in s])["p"]}
        d = result[part]["after_minus_before"]
        print(f"{part:5s} greedy success {result[part]['before']['mean']:.3f} -> {result[part]['after']['mean']:.3f}  "
              f"difference {d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]  p {result[part]['sign_test_p']:.3g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
