"""What an RL run changed in its greedy evaluations: each task's outcome before and after, by kind.

    .venv/bin/python benchmarks/rl_outcomes.py runs/rl_val_gigpo/*-s[012] [--out FILE.json]

Each run dir holds ``eval_tasks_start.json`` (its initial policy) and ``eval_tasks.json`` (its last evaluation), on
the same tasks. An outcome is ``success``, ``partial`` (a reward in (0, 1): in the shop, a purchase with a wrong
option, attribute or price) or ``zero`` (no reward: no purchase, or a wrong product). Printed and written: the
counts of each kind before and after, summed over the runs, and the 3×3 table of moves (start kind → end kind),
so that a mean reward that stays put while success falls shows as successes turned into partial purchases. Runs
are grouped by their dir name less its ``-s<seed>`` suffix (``benchmarks/rl_val.py``'s naming), one setting each.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import Any, NoReturn

KINDS = ("success", "partial", "zero")


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def kind(task: dict[str, Any]) -> str:
    if task["success"]:
        return "success"
    return "partial" if float(task["reward"]) > 0 else "zero"


def outcome_moves(run: Path) -> tuple[Counter[str], Counter[str], Counter[tuple[str, str]]]:
    """Counts before, after, and of (before, after) pairs, task by task."""
    start = json.loads((run / "eval_tasks_start.json").read_text())["per_task"]
    end = json.loads((run / "eval_tasks.json").read_text())["per_task"]
    if [t["task_id"] for t in start] != [t["task_id"] for t in end]:
        fail(f"{run}: the start and final evaluations are on other tasks")
    before = Counter(kind(t) for t in start)
    after = Counter(kind(t) for t in end)
    moves = Counter((kind(a), kind(b)) for a, b in zip(start, end, strict=True))
    return before, after, moves


def setting(run: Path) -> str:
    return re.sub(r"-s\d+$", "", run.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="RL run dirs with eval_tasks_start.json and eval_tasks.json")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    for run in args.runs:
        for name in ("eval_tasks_start.json", "eval_tasks.json"):
            if not (run / name).is_file():
                fail(f"{run / name} is missing (run the RL with eval_at_start, to the end)")
    groups: dict[str, list[Path]] = {}
    for run in args.runs:
        groups.setdefault(setting(run), []).append(run)
    result: dict[str, Any] = {"command": shlex.join(["python", *sys.argv]), "settings": {}}
    for label, runs in groups.items():
        before: Counter[str] = Counter()
        after: Counter[str] = Counter()
        moves: Counter[tuple[str, str]] = Counter()
        for run in runs:
            b, a, m = outcome_moves(run)
            before += b
            after += a
            moves += m
        entry = {"runs": [str(r) for r in runs], "tasks": sum(before.values()),
                 "before": {k: before[k] for k in KINDS}, "after": {k: after[k] for k in KINDS},
                 "moves": {f"{x}->{y}": moves[(x, y)] for x in KINDS for y in KINDS if x != y}}
        result["settings"][label] = entry
        print(f"{label}: {len(runs)} runs, {entry['tasks']} tasks")
        print("  before " + "  ".join(f"{k} {before[k]}" for k in KINDS))
        print("  after  " + "  ".join(f"{k} {after[k]}" for k in KINDS))
        print("  moves  " + "  ".join(f"{k} {v}" for k, v in entry["moves"].items() if v))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
