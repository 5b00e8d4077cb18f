"""The task's goal at the head of every shop trace: does M_exp read the task better when every step writes it?

    .venv/bin/python benchmarks/goal_line.py --write data/base/train_v_ann.jsonl data/mix/trainv_n08_ann.jsonl \\
        data/base/val_ann.jsonl data/mix/val_n08_ann.jsonl --out-dir data/goal
    .venv/bin/python benchmarks/pretrained_base.py --part exp --train data/goal/train_v_ann.jsonl \\
        data/goal/trainv_n08_ann.jsonl --heldout data/goal/val_ann.jsonl --inits pretrained --seeds S --budget 1500 \\
        --steps 150 --points 1500 --threads 1 --work runs/goal/shipped --out runs/goal/shipped_sS.json
    .venv/bin/python benchmarks/checked_verdicts.py --runs runs/goal/shipped/exp/pretrained-sS \\
        --heldout data/goal/val_ann.jsonl --extra-heldout data/goal/val_n08_ann.jsonl --operands --out F

Why: on val, the M_exp's purchase trace gets the page's side of each check right once its base copies (the item's
price in 23-27 of 31 purchases from the copy-first base) and the task's side wrong (the task's attributes in 1-3
of 31, its product type in 2-3): README, "A copy-first curriculum". The task's side is a parse of the instruction
(``i need built in microphone and foldable headphones in white, and price lower than 220.00 dollars``), and
purchases are ~9% of the transitions, so in 150 steps of 16 the model sees a few hundred parses. Written at the head
of every trace, the same parse is supervised on every step, ~11x as often, and a purchase's checks can copy their
task operands from the head of the model's own output::

    want headphones; attr built in microphone; attr foldable; opt color=white; price <=220.00 | buy B0QUOZ2C; \\
type headphones=headphones y; ...

``--write`` rewrites annotated trajectory files (the rule annotator's traces in ``info.reasoning``) with that head
on every step of a shop trajectory whose goal parses, from the task's own goal (what the annotator already uses
for its purchase checks), and leaves any other step as it was, counted. The checker
(``dreamgym.envs.shop.recheck``) reads past the head. Scored on val only; a rejected option does not reach test.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from dreamgym.envs.shop.recheck import GOAL_SEP
from dreamgym.envs.shop.reward import ShopGoal


def goal_line(goal: ShopGoal) -> str:
    """``want TYPE; attr A; ...; opt N=V; ...; price <=BOUND``, in the order and words of the purchase checks."""
    parts = [f"want {goal.category}", *(f"attr {a}" for a in goal.attributes),
             *(f"opt {n}={v}" for n, v in goal.options.items())]
    parts.append(f"price <={'no limit' if math.isinf(goal.price_upper) else f'{goal.price_upper:.2f}'}")
    return "; ".join(parts)


def with_goal(record: dict[str, Any], counts: Counter[str]) -> dict[str, Any]:
    """One trajectory record (a JSONL line) with the goal at the head of each step's trace."""
    task = record.get("task") or {}
    try:
        head = goal_line(ShopGoal.from_dict(task.get("goal") or {}, task.get("task_id", "?"))) + GOAL_SEP
    except ValueError:
        counts["no_goal"] += 1
        return record
    for x in record.get("transitions", []):
        trace = (x.get("info") or {}).get("reasoning")
        if isinstance(trace, str) and trace:
            x["info"]["reasoning"] = head + trace
            counts["steps"] += 1
        else:
            counts["no_trace"] += 1
    counts["trajectories"] += 1
    return record


def goal_match(run: Path, heldout: list[Path], steps: int) -> dict[str, Any]:
    """How often a trained M_exp writes the task's goal as the annotation does, on the first ``steps`` transitions
    of ``heldout``: the whole head, and each part (type, attributes, options, price bound) on its own."""
    from checked_verdicts import load_run  # type: ignore[import-not-found]

    from dreamgym.envs.shop.recheck import split_goal
    from dreamgym.experience.protocol import ExperienceQuery
    from dreamgym.types import read_trajectories

    def parts(trace: str | None) -> dict[str, list[str]]:
        head = split_goal(trace or "")[0].removesuffix(GOAL_SEP)
        out: dict[str, list[str]] = {"type": [], "attr": [], "opt": [], "price": []}
        for part in head.split("; ") if head else []:
            kind, _, body = part.partition(" ")
            out.setdefault("type" if kind == "want" else kind, []).append(body)
        return out

    queries = [(t, i) for p in heldout for t in read_trajectories(p) for i in range(len(t.transitions))][:steps]
    preds = load_run(run).predict([ExperienceQuery.at_step(t, i) for t, i in queries], seed=0)
    right: Counter[str] = Counter()
    for (traj, i), pred in zip(queries, preds, strict=True):
        real, dreamt = parts(traj.transitions[i].info.get("reasoning")), parts(pred.reasoning)
        right["head"] += bool(real["type"]) and real == dreamt
        right["written"] += bool(dreamt["type"])
        for kind in ("type", "attr", "opt", "price"):
            right[kind] += real[kind] == dreamt[kind]
    return {"steps": len(queries), **{k: round(v / max(len(queries), 1), 3) for k, v in right.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", nargs="+", type=Path, help="annotated trajectory files")
    parser.add_argument("--out-dir", type=Path)
    parser.add_argument("--goal-match", nargs="+", type=Path, metavar="RUN", help="no writing: how often each trained "
                        "M_exp run writes the goal as the annotation does, on --heldout")
    parser.add_argument("--heldout", nargs="+", type=Path, default=[])
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()
    if args.goal_match:
        for run in args.goal_match:
            print(run, json.dumps(goal_match(run, args.heldout, args.steps)), flush=True)
        return
    if not args.write or not args.out_dir:
        parser.error("--write FILES --out-dir DIR, or --goal-match RUNS --heldout FILES")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for path in args.write:
        counts: Counter[str] = Counter()
        out = args.out_dir / path.name
        if out.resolve() == path.resolve():
            raise SystemExit(f"error: {out} would overwrite its input")
        with path.open() as src, out.open("w") as dst:
            for line in src:
                if line.strip():
                    dst.write(json.dumps(with_goal(json.loads(line), counts)) + "\n")
        print(out, dict(counts), flush=True)


if __name__ == "__main__":
    main()
