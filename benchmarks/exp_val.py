"""Bench seeds' M_exp as trained, on val: to choose between configs without looking at test.

    python benchmarks/exp_val.py RUN_A/seed0 RUN_B/seed0 ... [--computed-premises] [--out FILE.json]

The bench's fidelity stage scores M_exp on held-out **test** episodes. This scores each seed dir's M_exp as it was
trained and is served (its own ``prompt_budget``), teacher-forced (``evaluate_experience_model``), on
``heldout_episodes`` noisy-oracle episodes of the **val** tasks of its own config (collected and annotated as
``serve_budget.py`` does, seed + 2; so two configs with different pages are each scored on their own pages of the
same val games). Each figure is printed beside its majority answer. ``--computed-premises`` serves each M_exp with its
env's computed trace premises (``ProtocolConfig.computed_premises``), whatever it was saved with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from serve_budget import KEYS, score


def main(argv: list[str] | None = None) -> int:
    from dreamgym.experience.model import read_experience_config
    from dreamgym.pipeline import DemoConfig, annotate, collect_episodes
    from dreamgym.types import read_trajectories

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed_dirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, help="the JSON report (default: print only)")
    ap.add_argument("--computed-premises", action="store_true",
                    help="serve each M_exp with the env's computed trace premises (ProtocolConfig.computed_premises)")
    args = ap.parse_args(argv)
    for d in args.seed_dirs:
        if not (d / "experience_model" / "experience.json").is_file() or not (d / "demo_config.yaml").is_file():
            print(f"error: {d} holds no trained experience_model/ (experience.json) and demo_config.yaml", file=sys.stderr)
            return 2
    rows: list[dict[str, Any]] = []
    for d in args.seed_dirs:
        cfg = DemoConfig.model_validate(yaml.safe_load((d / "demo_config.yaml").read_text()))
        exp_cfg = read_experience_config(d / "experience_model")
        raw, annotated = d / "val_heldout.jsonl", d / "val_heldout_annotated.jsonl"
        collect_episodes(cfg, raw, cfg.heldout_episodes, "val", cfg.seed + 2, noise=cfg.heldout_noise)
        annotate(cfg, [raw], annotated)
        row = {"seed_dir": str(d), "seed": cfg.seed, "env_kwargs": cfg.env_kwargs,
               "prompt_budget": exp_cfg.prompt_budget, "computed_premises": args.computed_premises,
               "val": score(d, cfg, list(read_trajectories(annotated)), exp_cfg.prompt_budget,
                            args.computed_premises)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out is not None:
        cmd = "python benchmarks/exp_val.py " + " ".join(sys.argv[1:] if argv is None else argv)
        args.out.write_text(json.dumps({"command": cmd, "split": "val", "keys": list(KEYS), "seeds": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
