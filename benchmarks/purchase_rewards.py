"""Share of purchases that scored 1.0 in a run's saved rollouts (dream vs real): how kind the dream is.

    .venv/bin/python benchmarks/purchase_rewards.py runs/demo10/dreamgym runs/demo10/grpo_real
"""

import json
import sys
from pathlib import Path

for run in sys.argv[1:]:
    buys = perfect = 0
    for path in sorted(Path(run, "rollouts").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            last = (json.loads(line)["transitions"] or [{}])[-1]
            if str(last.get("action", "")).startswith("click[buy"):
                buys += 1
                perfect += last["reward"] >= 0.999
    print(f"{run}: {perfect} of {buys} purchases scored 1.0 ({perfect / max(buys, 1):.0%})")
