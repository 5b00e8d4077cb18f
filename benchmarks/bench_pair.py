"""Two benches' rows, paired task by task: what changing one thing (the policy's base, say) did to each row.

    python benchmarks/bench_pair.py NEW/bench.json OLD/bench.json [--out FILE.json]
    python benchmarks/bench_pair.py B/bench.json B/bench.json --rows dreamgym grpo_real   # two rows of one bench

For each row both benches ran, on the seeds both ran: the success and mean reward of each, and NEW minus OLD as a
paired bootstrap CI over seeds and tasks (``dreamgym.stats``; the benches' tasks are the same seeded test tasks, so
a task's two outcomes pair up; checked by task id) with the two-sided exact sign test on the tasks where exactly
one of the two succeeded. ``--rows A B`` pairs row A of NEW with row B of OLD instead (the same file twice compares
two rows of one bench: DreamGym against GRPO-real on the same tasks, say). A row's seeds must carry the same task ids
in the same order on both sides, else the pair is an error (exit 2), never a silently misaligned comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dreamgym.bench import paired
from dreamgym.stats import bootstrap_ci


def _rows(path: Path) -> dict[str, dict[str, Any]]:
    try:
        bench = json.loads(path.read_text(encoding="utf-8"))
        return {r["row"]: r for r in bench["rows"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a bench.json ({type(e).__name__})") from None


def pair(new: dict[str, dict[str, Any]], old: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row both benches ran, on the seeds both ran: each side's success and mean reward, and NEW minus OLD
    (``dreamgym.bench.paired``, which refuses seeds whose task ids differ)."""
    out = []
    for row in [r for r in new if r in old]:
        a, b = new[row]["per_task"], old[row]["per_task"]
        seeds = [s for s in a if s in b]
        a, b = {s: a[s] for s in seeds}, {s: b[s] for s in seeds}
        entry: dict[str, Any] = {"row": row, "method": new[row]["method"], "seeds": seeds}
        for key in ("success", "reward"):
            entry[key] = {"new": bootstrap_ci([[float(t[key]) for t in a[s]] for s in seeds]),
                          "old": bootstrap_ci([[float(t[key]) for t in b[s]] for s in seeds])}
        entry["new_minus_old"] = paired(a, b)
        out.append(entry)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("new", type=Path)
    ap.add_argument("old", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rows", nargs=2, metavar=("NEW_ROW", "OLD_ROW"), help="pair these two rows (else every shared row)")
    args = ap.parse_args()
    try:
        new, old = _rows(args.new), _rows(args.old)
        if args.rows:
            a, b = args.rows
            for row, side, path in ((a, new, args.new), (b, old, args.old)):
                if row not in side:
                    raise ValueError(f"{path} has no row {row!r} (it has {', '.join(side)})")
            label = f"{a} - {b}"
            new = {label: {**new[a], "method": f"{new[a]['method']} - {old[b]['method']}"}}
            old = {label: old[b]}
        rows = pair(new, old)
        if not rows:
            raise ValueError(f"{args.new} and {args.old} share no row")
    except ValueError as e:
        print(f"bench_pair.py: {e}", file=sys.stderr)
        sys.exit(2)
    for r in rows:
        s, p = r["success"], r["new_minus_old"]
        d = p["diff"]
        print(f"{r['method']:<28} {s['new']['mean']:.3f} vs {s['old']['mean']:.3f}: {d['mean']:+.3f} "
              f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}], {p['better']} / {p['worse']} tasks, "
              f"p={p['sign_test_p']:.3g}")
    if args.out:
        command = "python benchmarks/bench_pair.py " + " ".join(sys.argv[1:])
        args.out.write_text(json.dumps({"command": command, "new": str(args.new), "old": str(args.old),
                                        "rows": rows}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
