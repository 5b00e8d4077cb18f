"""Seconds per RL update with the LM head on the response window (``logits_to_keep`` on left-padded micro-batches,
the learner's default for Hugging Face models) against the whole sequences' logits (the learner before it), on the
same turns: a rollouts file's steps as the policy prompts them and writes their actions (its cloning target).

    python benchmarks/learner_update.py RUN/rollouts/iter_00001.jsonl --policy RUN_OR_INIT [--rows 128] \
        [--rounds 3] [--threads 2] --out FILE.json

Each round times one update of each way, alternating, in one process (one minibatch of ``--rows`` turns, micro-
batches of 32, the learner's length-sorted order both ways), so machine load falls on both alike; the report
holds every round's seconds, their medians and the ratio, with the prompt and response token counts.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    import numpy as np
    import torch

    from dreamgym.agent.policy import action_target, load_policy
    from dreamgym.baselines.sft import agent_observations
    from dreamgym.rl.batch import TurnRow
    from dreamgym.rl.config import RLConfig
    from dreamgym.rl.learner import Learner
    from dreamgym.types import read_trajectories

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rollouts", type=Path, help="a rollouts (or offline data) JSONL of the policy's env")
    ap.add_argument("--policy", type=Path, required=True, help="the policy run dir (its prompt format and model)")
    ap.add_argument("--rows", type=int, default=128, help="turns in the minibatch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not args.rollouts.is_file():
        print(f"error: {args.rollouts}: no such file", file=sys.stderr)
        raise SystemExit(2)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    policy = load_policy(args.policy)
    llm: Any = policy.llm
    eos = sorted(llm.eos_ids)[:1]
    rows: list[TurnRow] = []
    for traj in read_trajectories(args.rollouts):
        for obs, x in zip(agent_observations(traj), traj.transitions, strict=True):
            prompt = llm.encode(policy.fit_prompt(obs))  # the turn as the policy prompts and answers it
            target = action_target(obs, x.action, policy.cfg)
            response = list(llm.tokenizer(target, add_special_tokens=False)["input_ids"]) + eos
            rows.append(TurnRow(prompt, response, [-0.5] * len(response), advantage=(-1.0) ** len(rows)))
            if len(rows) == args.rows:
                break
        if len(rows) == args.rows:
            break
    if len(rows) < args.rows:
        print(f"error: {args.rollouts} holds {len(rows)} steps, fewer than --rows {args.rows}", file=sys.stderr)
        raise SystemExit(2)
    learner = Learner(policy, RLConfig(minibatch_size=args.rows, micro_batch_size=32, lr=1e-12,
                                       num_threads=args.threads))
    seconds: dict[str, list[float]] = {"window": [], "whole": []}
    for _ in range(args.rounds):
        for way in ("window", "whole"):
            learner.window = way == "window"
            t0 = time.perf_counter()
            learner.update(rows, np.random.default_rng(0))
            seconds[way].append(round(time.perf_counter() - t0, 3))
    median = {k: statistics.median(v) for k, v in seconds.items()}
    report = {
        "command": shlex.join(["python", *sys.argv]), "rows": args.rows, "threads": args.threads,
        "prompt_tokens": {"mean": statistics.mean(len(r.prompt_ids) for r in rows),
                          "min": min(len(r.prompt_ids) for r in rows), "max": max(len(r.prompt_ids) for r in rows)},
        "response_tokens": {"mean": statistics.mean(len(r.response_ids) for r in rows),
                            "max": max(len(r.response_ids) for r in rows)},
        "seconds": seconds, "median_seconds": median, "speedup": round(median["whole"] / median["window"], 2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("prompt_tokens", "response_tokens", "median_seconds", "speedup")}))


if __name__ == "__main__":
    main()
