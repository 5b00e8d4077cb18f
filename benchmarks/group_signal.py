"""What GRPO's groups offered the update: did the G sampled episodes of a task differ where the policy fails?

    .venv/bin/python benchmarks/group_signal.py runs/B/seed0/grpo_real runs/B/seed0/dreamgym [--out FILE.json]

Reads each RL run's training rollouts (``RUN/rollouts/iter_*.jsonl``, one line per episode; a task's episodes in
an iteration are its group) and counts, per run and summed over runs, the groups:

- ``reward_varies``: whose episode returns are not all equal (GRPO's advantage is then non-zero);
- ``mixed_success``: with at least one success and one failure;
- ``purchases_differ_in_product`` / ``purchases_differ_in_options``: with two or more purchases (an episode ending
  on ``click[buy now]``) of different products (the page's first element at the purchase) or, among purchases of
  the same product, different selected options (the elements marked ``(selected)``);
- ``purchase_choice_decides``: among those, the groups where a purchase of one choice succeeded and one of another
  did not: the cases in which the group holds a signal for choosing the product or the option, not only for buying.

A group whose episodes all buy the same thing (or never buy) teaches at most "buy"; so if most groups already hold
choice signals, exploration is not what keeps RL from teaching the choice. Shop runs only (the purchase's page
format); other envs' rollouts count only the first two kinds.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import NoReturn

from dreamgym.types import DataError, Trajectory, read_trajectories

KINDS = ("groups", "reward_varies", "mixed_success", "purchases_differ_in_product", "purchases_differ_in_options",
         "purchase_choice_decides")


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def purchase(episode: Trajectory) -> tuple[str, tuple[str, ...]] | None:
    """(product, selected options) of an episode that ends on a purchase, else None."""
    if not episode.transitions:
        return None
    last = episode.transitions[-1]
    if last.action.strip().lower() != "click[buy now]" or not last.done:
        return None
    lines = [line.split("] ", 1)[-1] for line in last.state.splitlines()]
    if not lines:
        return None
    return lines[0], tuple(sorted(line for line in lines if line.endswith("(selected)")))


def group_counts(episodes: list[Trajectory]) -> Counter[str]:
    """The kinds (``KINDS``) one group of episodes of the same task counts in."""
    out: Counter[str] = Counter(groups=1)
    wins = [e.success for e in episodes]
    out["reward_varies"] = int(len({round(e.total_reward, 6) for e in episodes}) > 1)
    out["mixed_success"] = int(any(wins) and not all(wins))
    bought = [(p, e.success) for e in episodes if (p := purchase(e)) is not None]
    by_product: defaultdict[str, set[tuple[str, ...]]] = defaultdict(set)
    for (product, options), _ in bought:
        by_product[product].add(options)
    out["purchases_differ_in_product"] = int(len(by_product) > 1)
    out["purchases_differ_in_options"] = int(any(len(v) > 1 for v in by_product.values()))
    won = {p for p, w in bought if w}
    lost = {p for p, w in bought if not w}
    out["purchase_choice_decides"] = int(bool(won) and bool(lost - won))
    return out


def run_counts(run: Path) -> Counter[str]:
    files = sorted((run / "rollouts").glob("iter_*.jsonl"))
    if not files:
        fail(f"{run} has no rollouts/iter_*.jsonl (an RL run with save_rollouts)")
    total: Counter[str] = Counter({k: 0 for k in KINDS})
    for f in files:
        groups: defaultdict[str, list[Trajectory]] = defaultdict(list)
        try:
            for episode in read_trajectories(f):
                groups[episode.task.task_id].append(episode)
        except DataError as e:
            fail(str(e))
        for episodes in groups.values():
            total.update(group_counts(episodes))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+", help="RL run dirs")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    per = {str(r): dict(run_counts(r)) for r in args.runs}
    total = {k: sum(c[k] for c in per.values()) for k in KINDS}
    for name, c in [*per.items(), ("total", total)]:
        print(f"{name}: " + ", ".join(f"{k} {c[k]}" for k in KINDS))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": shlex.join(["python", *sys.argv]), "runs": per, "total": total},
                                       indent=1) + "\n")


if __name__ == "__main__":
    main()
