"""A bench seed whose RL row was stopped before its last iteration: the row's latest test evaluation against SFT.

    python benchmarks/bench_partial.py RUN/seedN ROW [--out FILE.json]

``dreamgym bench`` tabulates a row only once its stage has finished. An RL row evaluates the policy on the seed's
test tasks every ``rl.eval_every`` iterations and keeps the latest evaluation in ``RUN/seedN/ROW/eval_tasks.json``
(``dreamgym.rl.evaluate``). This reads that evaluation and the SFT stage's (``RUN/seedN/sft/eval_tasks.json``, the
same tasks: checked by task id) and prints the row's success with its bootstrap CI over tasks, the paired
difference from SFT (``dreamgym.bench.paired``: paired bootstrap CI and sign test), the random policy on the same
tasks (``dreamgym.bench.random_baseline``) and the seed's M_exp fidelity beside its majority baselines. A finished
stage is for ``dreamgym bench`` itself; this is for the one that was stopped, and says at which iteration.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dreamgym.bench import paired, random_baseline
from dreamgym.pipeline import demo_config
from dreamgym.rl.evaluate import EVAL_TASKS
from dreamgym.stats import bootstrap_ci

FIDELITY = ("terminal_reward_accuracy", "terminal_reward_majority_baseline", "done_accuracy", "done_majority_baseline",
            "reward_accuracy", "reward_majority_baseline", "invalid_output_rate", "next_state_f1")


def _evaluation(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {"iteration": int(data["iteration"]), "per_task": list(data["per_task"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: no evaluation ({type(e).__name__})") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a bench seed's run dir, e.g. runs/bench/seed0")
    ap.add_argument("row", help="an RL row's stage name, e.g. dreamgym or grpo_real")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    try:
        saved = args.run / "demo_config.yaml"  # the seed's config, as the bench wrote it
        if not saved.is_file():
            raise ValueError(f"{saved}: no such file (not a bench seed's run dir)")
        cfg = demo_config("default", None, saved)
        sft, row = _evaluation(args.run / "sft" / EVAL_TASKS), _evaluation(args.run / args.row / EVAL_TASKS)
        diff = paired({"seed": row["per_task"]}, {"seed": sft["per_task"]})
    except ValueError as e:
        print(f"bench_partial.py: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    rand = random_baseline(cfg, args.run)
    fid_path = args.run / "fidelity.json"
    fid = json.loads(fid_path.read_text()) if fid_path.is_file() else {}

    def success(per_task: list[dict[str, Any]]) -> dict[str, float]:
        return bootstrap_ci([[float(t["success"]) for t in per_task]])

    result = {"command": "python benchmarks/bench_partial.py " + " ".join(sys.argv[1:]), "env": cfg.env,
              "seed": cfg.seed, "row": args.row, "row_iteration": row["iteration"],
              "planned_iterations": cfg.dream_iterations if args.row.startswith(("dreamgym", "no_")) else
              cfg.rl.get("iterations"), "episodes": len(sft["per_task"]),
              "sft_success": success(sft["per_task"]), "row_success": success(row["per_task"]),
              "row_minus_sft": diff, "random_policy_success": None if rand is None else rand["success_rate"],
              "fidelity": {k: fid.get(k) for k in FIDELITY},
              "per_task": {"sft": sft["per_task"], args.row: row["per_task"]}}
    d = diff["diff"]
    print(f"{cfg.env} seed {cfg.seed}: SFT {result['sft_success']['mean']:.3f}, {args.row} after iteration "
          f"{row['iteration']} of {result['planned_iterations']}: {result['row_success']['mean']:.3f}, "
          f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] ({diff['better']} tasks won, "
          f"{diff['worse']} lost, p={diff['sign_test_p']:.3g}); random policy {result['random_policy_success']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
