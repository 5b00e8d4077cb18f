"""Fit a bench seed's reward head again with the current code, in place: what its ``train_exp`` stage fits
(``RewardHead.fit(endings(offline_annotated.jsonl), seed=cfg.seed)``, before and apart from M_exp's SFT), without
training M_exp again; the seed's fidelity and dream stages must then be run again (delete their stage files).

    python benchmarks/refit_reward_head.py RUN/seed0 [RUN/seed1 ...]
    python benchmarks/refit_reward_head.py RUN/seed0 ... --copy-to NEW --fidelity   # NEW/RUN/seed0: the fidelity again
    python benchmarks/refit_reward_head.py RUN/seed0 --copy-to NEW --add --fidelity  # a run made without a head

Used when the head's features change while M_exp's weights do not (the head reads the page and the task, never M_exp).
``--copy-to NEW`` leaves the run as it was: it copies each seed's ``experience_model/`` to ``NEW/<run name>/<seed>/``
and refits there, ready for the same ``dreamgym bench`` command with ``--out NEW/<run name>`` to run the fidelity
and dream stages again with the new head (:func:`copy_seed`; every other stage is found made). ``--fidelity`` runs
the seed's fidelity stage alone there instead (``dreamgym.pipeline.fidelity``), writing ``fidelity.json`` for
``benchmarks/fidelity_table.py``. ``--add`` (with ``--copy-to`` only) gives a head to a seed whose M_exp was trained
without one: the copy's config and M_exp's ``experience.json`` are marked ``reward_head: true`` (M_exp's SFT does not
depend on it), so that ``--fidelity`` measures the head with M_exp's weights as they were. (The bench itself then
finds the copy's M_exp stage made under another config, and refuses it without ``--force``.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import yaml


def main(argv: list[str] | None = None) -> int:
    from dreamgym.experience.reward_head import RewardHead, endings
    from dreamgym.types import read_trajectories

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed_dirs", nargs="+", type=Path)
    ap.add_argument("--copy-to", type=Path, help="refit in a copy under this dir (NEW/<run name>/<seed>), not in place")
    ap.add_argument("--fidelity", action="store_true", help="then run the seed's fidelity stage again")
    ap.add_argument("--add", action="store_true", help="with --copy-to: add a head to a seed trained without one")
    args = ap.parse_args(argv)
    if args.add and args.copy_to is None:
        print("error: --add needs --copy-to (a run's own config is never rewritten)", file=sys.stderr)
        return 2
    for d in args.seed_dirs:
        model, data = d / "experience_model", d / "offline_annotated.jsonl"
        if not (model / "config.json").is_file() or not data.is_file():
            print(f"error: {d} holds no trained experience_model/ and offline_annotated.jsonl", file=sys.stderr)
            return 2
        cfg = yaml.safe_load((d / "demo_config.yaml").read_text())
        if not cfg.get("exp_reward_head") and not args.add:
            print(f"error: {d}: its config has no reward head (exp_reward_head)", file=sys.stderr)
            return 2
        if args.fidelity and not (d / "heldout_annotated.jsonl").is_file():
            print(f"error: {d} holds no heldout_annotated.jsonl (its fidelity stage never ran)", file=sys.stderr)
            return 2
        if args.copy_to is not None:
            d = copy_seed(d, args.copy_to / d.resolve().parent.name / d.name)
            model, data = d / "experience_model", d / "offline_annotated.jsonl"
            if args.add:
                cfg = {**cfg, "exp_reward_head": True}
                (d / "demo_config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
                exp_file = model / "experience.json"
                exp_file.write_text(json.dumps({**json.loads(exp_file.read_text()), "reward_head": True}, indent=2))
        head = RewardHead.fit(endings(read_trajectories(data)), seed=int(cfg.get("seed", 0)))
        head.save(model)
        summary_file = model / "summary.json"
        if summary_file.is_file():  # the training summary names the head it fitted: now this one
            summary = json.loads(summary_file.read_text())
            summary["reward_head"] = {**head.summary, "refit_by": "benchmarks/refit_reward_head.py"}
            summary_file.write_text(json.dumps(summary, indent=2))
        print(d, json.dumps(head.summary))
        if args.fidelity:
            from dreamgym.pipeline import DemoConfig, fidelity

            report = fidelity(DemoConfig.model_validate(cfg), d, model)
            print(d, "fidelity:", json.dumps({k: v for k, v in report.items() if k != "heldout"}))
    return 0


def copy_seed(src: Path, dst: Path) -> Path:
    """``dst`` ready for ``dreamgym bench --out <dst's parent>`` to rerun the stages after M_exp's: a copy of
    ``src``'s M_exp, its config and held-out episodes; links (absolute) to what the stages before read and never
    write (offline data, replay buffer, SFT and GRPO-real runs); and those stages' markers, so the bench finds them
    made under the same keys. The fidelity and dream stages have no marker there: the bench runs them again."""
    (dst / "stages").mkdir(parents=True, exist_ok=True)
    for name in ("experience_model", "demo_config.yaml", "heldout.jsonl", "heldout_annotated.jsonl"):
        if (src / name).exists() and not (dst / name).exists():
            (shutil.copytree if (src / name).is_dir() else shutil.copy2)(src / name, dst / name)
    for name in ("offline.jsonl", "offline_extra", "offline_annotated.jsonl", "buffer", "sft", "grpo_real"):
        if (src / name).exists() and not (dst / name).exists():
            (dst / name).symlink_to((src / name).resolve())
    for stage in ("collect", "annotate", "train_exp", "sft", "grpo_real"):
        if (src / "stages" / f"{stage}.json").is_file() and not (dst / "stages" / f"{stage}.json").exists():
            shutil.copy2(src / "stages" / f"{stage}.json", dst / "stages" / f"{stage}.json")
    return dst


if __name__ == "__main__":
    sys.exit(main())
