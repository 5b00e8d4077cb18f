"""How kind the dream is: what a run's saved training rollouts paid for a purchase (dream vs real).

    .venv/bin/python benchmarks/purchase_rewards.py runs/bench_cw/seed0/dreamgym runs/bench_cw/seed0/grpo_real \
        [--out FILE.json]

Per run dir (its ``rollouts/iter_*.jsonl``): the episodes, the share that end by buying, the purchases that scored
1.0 and those that scored in (0, 1) (the real shop's partial credit for a wrong option or attribute), the mean final
reward, and the GRPO groups (episodes of one task in one iteration) whose final rewards differ, the only groups that
carry a gradient. A dream whose every purchase scores 1.0 pays for buying, not for buying the right thing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any


def purchase_stats(run: Path) -> dict[str, Any]:
    episodes = buys = perfect = partial = varied = groups = 0
    reward_sum = 0.0
    for path in sorted(run.glob("rollouts/iter_*.jsonl")):
        by_task: dict[str, set[float]] = {}
        for line in path.read_text().splitlines():
            traj = json.loads(line)
            last = (traj["transitions"] or [{}])[-1]
            reward = float(last.get("reward", 0.0))
            episodes += 1
            reward_sum += reward
            by_task.setdefault(traj["task"]["task_id"], set()).add(round(reward, 4))
            if str(last.get("action", "")).lower().startswith("click[buy"):
                buys += 1
                perfect += reward >= 0.999
                partial += 0.0 < reward < 0.999
        groups += len(by_task)
        varied += sum(len(rewards) > 1 for rewards in by_task.values())
    return {"run": str(run), "episodes": episodes, "buy_share": buys / max(episodes, 1), "purchases": buys,
            "purchases_scored_1": perfect, "purchases_scored_partial": partial,
            "share_of_purchases_scored_1": perfect / max(buys, 1), "mean_final_reward": reward_sum / max(episodes, 1),
            "groups": groups, "groups_with_reward_variance": varied}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="RL run dirs with saved rollouts")
    ap.add_argument("--out", type=Path, help="write the figures and the command here as JSON")
    args = ap.parse_args()
    missing = [str(r) for r in args.runs if not any(r.glob("rollouts/iter_*.jsonl"))]
    if missing:
        print(f"error: no rollouts/iter_*.jsonl in {', '.join(missing)}", file=sys.stderr)
        raise SystemExit(2)
    rows = [purchase_stats(r) for r in args.runs]
    for r in rows:
        print(f"{r['run']}: {r['episodes']} episodes, {r['buy_share']:.0%} end by buying; "
              f"{r['purchases_scored_1']} of {r['purchases']} purchases scored 1.0, {r['purchases_scored_partial']} "
              f"partial credit; mean final reward {r['mean_final_reward']:.3f}; "
              f"{r['groups_with_reward_variance']} of {r['groups']} groups with reward variance")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command = shlex.join(["python", *sys.argv])
        args.out.write_text(json.dumps({"command": command, "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
