"""M_exp served with ``ExperienceConfig.prompt_budget`` against the rule before it, on val, for trained bench seeds.

    python benchmarks/serve_budget.py RUN/seed0 [RUN/seed1 ...] --out benchmarks/results/serve_budget.json
    python benchmarks/serve_budget.py RUN/seed0 ... --copy-to NEW     # NEW/<run name>/<seed>: M_exp with the budget

Before 2026-12-06 a served prompt was fitted to the context minus ``max_new_tokens`` (1.25 × the longest training
target), while SFT fits each prompt to its ``max_length`` minus its own target: a served prompt lost its neighbours
(then its history, then state lines) far more often than the same prompt did in training. ``train-exp`` now writes
``prompt_budget`` (``served_prompt_budget``: the trained length minus the median target, at most the context minus
the 0.99 quantile of the targets, at least half the trained length) and a served prompt is fitted to it (SFT's too, where its own target leaves more).
A model trained before can be served either way: this script computes the budget its training would now write (the
same examples, mixture and neighbours) and scores M_exp both ways, teacher-forced (``evaluate_experience_model``),
on ``heldout_episodes`` noisy-oracle episodes of the **val** tasks (collected and annotated as the fidelity stage
does for test, seed + 2). ``--copy-to`` then writes a copy of each seed with the budget in its M_exp's
``experience.json`` (``refit_reward_head.copy_seed``), for the same ``dreamgym bench`` command with ``--out
NEW/<run name>`` and ``--set exp_reserve_prompt=false`` (the copy's M_exp keeps its training and its stage key) to
run the dream stages again.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

KEYS = ("terminal_reward_accuracy", "terminal_reward_majority_baseline", "done_accuracy", "done_majority_baseline",
        "reward_majority_baseline",
        "reward_accuracy", "invalid_output_rate", "next_state_f1", "click_consistency", "reward_consistency",
        "repeated_element_rate", "repeated_element_real_rate")


def budget_of(seed_dir: Path, seed: int, trained_cap: bool = True) -> tuple[int, int]:
    """(prompt_budget, max_new_tokens) that ``train_experience_model`` writes today for this seed's M_exp (``seed``:
    the bench seed, which its mixture was drawn with); without
    ``trained_cap`` the budget is only the context minus the 0.99 quantile of the targets (the first form of the
    fix, which the dream copies of 2026-12-06 were served at)."""
    from dreamgym.experience.model import ExperienceConfig
    from dreamgym.experience.train import (
        exp_pairs,
        load_pretrained,
        mix,
        read_training_data,
        served_prompt_budget,
        step_kinds,
        target_token_counts,
    )
    from dreamgym.replay import ReplayBuffer

    summary = json.loads((seed_dir / "experience_model" / "summary.json").read_text())
    exp_cfg = ExperienceConfig.model_validate_json((seed_dir / "experience_model" / "experience.json").read_text())
    protocol = exp_cfg.protocol_config()
    trajs = read_training_data(summary["data"])
    buffer = None
    if protocol.k > 0:
        buffer = ReplayBuffer.open(seed_dir / "buffer", create=False, read_only=True)
    try:
        examples = [ex for _, ex in exp_pairs(trajs, protocol, buffer, chat=exp_cfg.chat)]
    finally:
        if buffer is not None:
            buffer.close()
    if summary.get("mixture"):
        examples = mix(examples, step_kinds(trajs), summary["mixture"], seed)
    lm, tokenizer = load_pretrained(str(seed_dir / "experience_model"))
    tokens_of = target_token_counts(tokenizer, examples)
    lengths = [tokens_of[ex.target] for ex in examples]
    max_length = int(summary["sft"]["max_length"])
    context = getattr(lm.config, "max_position_embeddings", None) or max_length
    return served_prompt_budget(lengths, max_length if trained_cap else context, context), exp_cfg.max_new_tokens


def score(seed_dir: Path, cfg: Any, heldout: list[Any], budget: int | None, premises: bool = False) -> dict[str, Any]:
    """M_exp of ``seed_dir`` on ``heldout``, served with prompt budget ``budget`` (and, with ``premises``, the env's
    computed trace premises, ``ProtocolConfig.computed_premises``)."""
    import torch

    from dreamgym.experience.fidelity import evaluate_experience_model
    from dreamgym.experience.model import ExperienceModel, read_experience_config
    from dreamgym.replay import ReplayBuffer

    buffer = ReplayBuffer.open(seed_dir / "buffer", create=False, read_only=True) if (seed_dir / "buffer").is_dir() else None
    torch.set_num_threads(int(cfg.exp_sft.get("num_threads") or 1))
    exp_cfg = read_experience_config(seed_dir / "experience_model").model_copy(update={"prompt_budget": budget})
    if premises:
        exp_cfg = exp_cfg.with_protocol(computed_premises=True)
    model = ExperienceModel.load(seed_dir / "experience_model", buffer=buffer, cfg=exp_cfg)
    report = evaluate_experience_model(model, heldout, seed=cfg.seed)
    out = {k: report.get(k) for k in KEYS}
    out["next_state_copy_baseline_f1"] = report["next_state_copy_baseline"]["f1"]  # the page left as it was
    out["shortened_prompts"] = model.shortened_prompts
    if premises:
        out["premised"] = model.premised
    out["transitions"] = report["transitions"]
    out["seconds"] = report["seconds"]
    return out


def main(argv: list[str] | None = None) -> int:
    from dreamgym.pipeline import DemoConfig, annotate, collect_episodes
    from dreamgym.types import read_trajectories

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed_dirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, help="the JSON report (default: print only)")
    ap.add_argument("--copy-to", type=Path, help="write NEW/<run name>/<seed> with the budget, for the dream stages")
    ap.add_argument("--no-score", action="store_true", help="with --copy-to: only write the copies")
    ap.add_argument("--no-trained-cap", action="store_true", help="the budget as the context minus the targets' 0.99 "
                    "quantile only, not capped at the trained length minus the median target")
    args = ap.parse_args(argv)
    for d in args.seed_dirs:
        if not (d / "experience_model" / "summary.json").is_file() or not (d / "demo_config.yaml").is_file():
            print(f"error: {d} holds no trained experience_model/ (summary.json) and demo_config.yaml", file=sys.stderr)
            return 2
    rows = []
    for d in args.seed_dirs:
        cfg = DemoConfig.model_validate(yaml.safe_load((d / "demo_config.yaml").read_text()))
        budget, max_new = budget_of(d, cfg.seed, trained_cap=not args.no_trained_cap)
        row: dict[str, Any] = {"seed_dir": str(d), "seed": cfg.seed, "prompt_budget": budget, "max_new_tokens": max_new}
        if not args.no_score:
            raw, annotated = d / "val_heldout.jsonl", d / "val_heldout_annotated.jsonl"
            collect_episodes(cfg, raw, cfg.heldout_episodes, "val", cfg.seed + 2, noise=cfg.heldout_noise)
            annotate(cfg, [raw], annotated)
            heldout = list(read_trajectories(annotated))
            row["before"] = score(d, cfg, heldout, None)
            row["budget"] = score(d, cfg, heldout, budget)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.copy_to is not None:
            sys.path.insert(0, str(Path(__file__).parent))
            from refit_reward_head import copy_seed

            dst = copy_seed(d, args.copy_to / d.resolve().parent.name / d.name)
            exp_file = dst / "experience_model" / "experience.json"
            exp_file.write_text(json.dumps({**json.loads(exp_file.read_text()), "prompt_budget": budget}, indent=2))
    if args.out is not None:
        mean = {side: {k: _mean([r[side][k] for r in rows if side in r]) for k in (*KEYS, "shortened_prompts")}
                for side in ("before", "budget")}
        cmd = "python benchmarks/serve_budget.py " + " ".join(sys.argv[1:] if argv is None else argv)
        args.out.write_text(json.dumps({"command": cmd, "split": "val", "seeds": rows, "mean": mean,
                                        "budget_minus_before": paired(rows)}, indent=2))
    return 0


def paired(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key, each seed's ``budget - before`` and their mean with a bootstrap CI over seeds (the report keeps no
    per-transition figures, so the seeds are the unit)."""
    from dreamgym.stats import bootstrap_ci

    out: dict[str, Any] = {}
    for k in KEYS:
        diffs = [r["budget"][k] - r["before"][k] for r in rows
                 if "budget" in r and isinstance(r["budget"][k], int | float) and isinstance(r["before"][k], int | float)]
        if diffs:
            ci = bootstrap_ci([[d] for d in diffs])
            out[k] = {"per_seed": [round(d, 4) for d in diffs], **{n: round(v, 4) for n, v in ci.items()}}
    return out


def _mean(values: list[Any]) -> float | None:
    got = [v for v in values if isinstance(v, int | float)]
    return round(sum(got) / len(got), 4) if got else None


if __name__ == "__main__":
    sys.exit(main())
