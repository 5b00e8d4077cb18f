"""Fit a bench seed's reward head again with the current code, in place: what its ``train_exp`` stage fits
(``RewardHead.fit(endings(offline_annotated.jsonl), seed=cfg.seed)``, before and apart from M_exp's SFT), without
training M_exp again; the seed's fidelity and dream stages must then be run again (delete their stage files).

    python benchmarks/refit_reward_head.py RUN/seed0 [RUN/seed1 ...]

Used when the head's features change while M_exp's weights do not (the head reads the page and the task, never M_exp).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml


def main(argv: list[str] | None = None) -> int:
    from dreamgym.experience.reward_head import RewardHead, endings
    from dreamgym.types import read_trajectories

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed_dirs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    for d in args.seed_dirs:
        model, data = d / "experience_model", d / "offline_annotated.jsonl"
        if not (model / "config.json").is_file() or not data.is_file():
            print(f"error: {d} holds no trained experience_model/ and offline_annotated.jsonl", file=sys.stderr)
            return 2
        cfg = yaml.safe_load((d / "demo_config.yaml").read_text())
        if not cfg.get("exp_reward_head"):
            print(f"error: {d}: its config has no reward head (exp_reward_head)", file=sys.stderr)
            return 2
        head = RewardHead.fit(endings(read_trajectories(data)), seed=int(cfg.get("seed", 0)))
        head.save(model)
        summary_file = model / "summary.json"
        if summary_file.is_file():  # the training summary names the head it fitted: now this one
            summary = json.loads(summary_file.read_text())
            summary["reward_head"] = {**head.summary, "refit_by": "benchmarks/refit_reward_head.py"}
            summary_file.write_text(json.dumps(summary, indent=2))
        print(d, json.dumps(head.summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
