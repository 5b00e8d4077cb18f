"""Rollout throughput of an LLM policy on the real shop at group sizes 1, 4, 8 (same tasks), and where one
training iteration's time goes (generation, env stepping, the update), measured side by side in one run.

    .venv/bin/python benchmarks/bench_rollout.py --policy RUN_DIR [--tasks 8] [--group-sizes 1,4,8]

``--policy`` is a policy run dir (e.g. the SFT warm start of ``benchmarks/shop_rl.py``); without it a fresh
``--preset`` model is made (untrained: it writes invalid actions until ``max_steps``, which still measures
the machinery). Writes benchmarks/results/bench_rollout.json with the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dreamgym.agent.policy import LLMPolicy, PolicyConfig, load_policy
from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.envs.pool import LocalEnvPool, env_factory
from dreamgym.llm.hf import HFLLM
from dreamgym.llm.tiny import init_tiny_model
from dreamgym.rl.batch import grpo_advantages, turn_rows
from dreamgym.rl.config import RLConfig
from dreamgym.rl.learner import Learner
from dreamgym.rl.rollout import RolloutStats, collect_rollouts, count_env_steps
from dreamgym.types import write_jsonl

RESULTS = Path(__file__).parent / "results" / "bench_rollout.json"


def fresh_policy(preset: str, shop: dict[str, Any], tmp: Path) -> LLMPolicy:
    env = make("shop", **shop)
    write_jsonl(tmp / "corpus.jsonl", iter_episodes(env, env.scripted_policy("noisy"), 200, seed=0))
    init_tiny_model(preset, [tmp / "corpus.jsonl"], tmp / "model")
    return LLMPolicy(HFLLM.from_pretrained(tmp / "model"), PolicyConfig())


def bench_group(
    policy: LLMPolicy, shop: dict[str, Any], tasks: list[Any], group_size: int, max_steps: int, seed: int
) -> dict[str, Any]:
    """One GRPO iteration's rollout + update at this group size; throughput and time shares."""
    pool = LocalEnvPool(env_factory("shop", **shop), len(tasks) * group_size)
    stats = RolloutStats()
    t0 = time.perf_counter()
    episodes = collect_rollouts(pool, policy, tasks, group_size, max_steps=max_steps, seed=seed, stats=stats)
    rollout_s = time.perf_counter() - t0
    row: dict[str, Any] = {
        "group_size": group_size, "episodes": len(episodes), "env_steps": count_env_steps(episodes),
        "policy_calls": stats.policy_calls, "generated_tokens": stats.generated_tokens,
        "mean_prompt_tokens": round(stats.prompt_tokens / max(stats.env_steps, 1), 1),
        "rollout_s": round(rollout_s, 2),
        "env_steps_per_s": round(stats.env_steps / rollout_s, 1),
        "policy_tokens_per_s": round(stats.generated_tokens / stats.generation_s, 1),
        "env_only_steps_per_s": round(stats.env_steps / max(stats.env_s, 1e-9), 1),
    }
    if group_size > 1:  # the update, so that an iteration's time splits into generation / env / update
        llm: Any = policy.llm
        cfg = RLConfig(algo="grpo", group_size=group_size, minibatch_size=128, micro_batch_size=32)
        learner = Learner(policy, cfg)
        state = {k: v.clone() for k, v in llm.model.state_dict().items()}
        t0 = time.perf_counter()
        rows = turn_rows(episodes)
        grpo_advantages(episodes, rows, cfg.normalize_std)
        learner.update(rows, np.random.default_rng(seed))
        update_s = time.perf_counter() - t0
        llm.model.load_state_dict(state)  # every group size measures the same policy
        total = stats.generation_s + stats.env_s + update_s
        row.update({
            "update_s": round(update_s, 2), "trained_tokens": sum(len(r.prompt_ids) + len(r.response_ids) for r in rows),
            "share": {"generation": round(stats.generation_s / total, 3), "env": round(stats.env_s / total, 3),
                      "update": round(update_s / total, 3)},
        })
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", type=Path, default=None, help="policy run dir (default: a fresh --preset model)")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--num-products", type=int, default=200)
    ap.add_argument("--results-per-page", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group-sizes", default="1,4,8")
    ap.add_argument("--max-steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shop = {"num_products": args.num_products, "results_per_page": args.results_per_page}
    with tempfile.TemporaryDirectory() as tmp:
        policy = load_policy(args.policy) if args.policy else fresh_policy(args.preset, shop, Path(tmp))
        llm: Any = policy.llm
        params = sum(p.numel() for p in llm.model.parameters())
        tasks = make("shop", **shop).tasks("train")[: args.tasks]
        rows = []
        for g in (int(x) for x in args.group_sizes.split(",")):
            rows.append(bench_group(policy, shop, tasks, g, args.max_steps, args.seed))
            print(json.dumps(rows[-1]))
    out = {
        "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv]),
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": args.threads},
        "policy": str(args.policy) if args.policy else f"fresh {args.preset}", "parameters": params,
        "shop": shop, "tasks": args.tasks, "max_steps": args.max_steps, "results": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
