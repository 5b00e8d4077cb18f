"""From scratch vs from the shipped pre-trained base: the experience model's fidelity and the policy's success
after the same fine-tuning budget, over seeds.

    .venv/bin/python benchmarks/pretrained_base.py --part exp --train data/base/train_ann.jsonl \
        --heldout data/base/heldout_ann.jsonl --extra-heldout data/base/heldout_n08_ann.jsonl \
        --inits pretrained 128x4 --seeds 0 1 2 --budget 600 --steps 150 --points 150 300 600 \
        --set protocol.copy_refs=false    # the plain protocol (pretrained_base_exp.json)
    .venv/bin/python benchmarks/pretrained_base.py --part exp --train data/base/train_ann.jsonl \
        --heldout data/base/heldout_ann.jsonl --extra-heldout data/base/heldout_n08_ann.jsonl \
        --inits pretrained 128x4 --seeds 0 1 2 --budget 600 --time-cap 1800 --steps 150 --points 1800 \
        --work runs/refs2 --out benchmarks/results/pretrained_base_exp_refs.json    # copy references (the config's)
    .venv/bin/python benchmarks/pretrained_base.py --part policy --train data/base/train.jsonl \
        --inits pretrained 128x4 --seeds 0 1 2 --budget 600 --policy-steps 125

Data: ``dreamgym collect --policy noisy --noise 0.3 --episodes 2000 --split train --seed 0`` (annotated with
``dreamgym annotate --annotator rule``) for training; ``--noise 0.5 --episodes 60 --split test --seed 100000`` for
the held-out fidelity set (90% of its purchases score >= 0.9, so always answering 1.0 is right on 0.91 of its
terminal steps), and the same at ``--noise 0.8`` (same seed) for ``--extra-heldout`` (purchases of every reward).

``--part exp`` fine-tunes M_exp with ``configs/exp-shop-tiny.yaml`` (the model replaced by each init) for
``--steps`` optimizer steps, its learning-rate schedule spanning them, with ``--budget`` seconds as a cap; it
snapshots the run at the ``--points`` seconds (mid-schedule snapshots, not runs with their own shorter schedule)
and scores each with ``evaluate_experience_model``, the last (the end of the budget) on ``--extra-heldout`` too.
``--part policy`` behaviour-clones the successful trajectories (index actions, the demo's settings) for
``--policy-steps`` steps and evaluates greedy success on 200 test tasks. The step budgets are what fitted in
600 s on one core of the 2-core machine with the other core busy (one job per core). Every result is
appended to ``--out`` (one JSON file per part) as soon as it exists, and a cell already there is skipped, so
an interrupted run continues. ``--summarise`` prints mean, sd and the 95% t interval per cell.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).parent / "results"
EXP_KEYS = ("click_consistency", "item_options_consistency", "option_consistency", "reward_consistency", "purchase_page_consistency",
            "zero_reward_consistency", "terminal_reward_accuracy", "terminal_reward_majority_baseline",
            "terminal_reward_exact_accuracy", "terminal_reward_exact_majority_baseline", "done_accuracy",
            "done_majority_baseline", "reward_accuracy", "reward_majority_baseline", "invalid_output_rate",
            "next_state_exact", "next_state_f1", "next_state_copy_baseline", "epsilon_r", "transitions",
            "terminal_transitions")


def t95(n: int) -> float:
    """Two-sided 95% Student t quantile for n-1 degrees of freedom (n <= 30; 1.96 beyond)."""
    table = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}
    return table.get(n, 2.0 if n <= 30 else 1.96)


def mean_ci(xs: list[float]) -> tuple[float, float, float]:
    """Mean, sample sd and the half-width of the 95% t interval."""
    m = statistics.fmean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
    return m, sd, t95(len(xs)) * sd / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {"commands": [], "cells": {}}


def save(path: Path, results: dict[str, Any]) -> None:
    """Merge ``results`` into the file under a lock, so several runs (one per core) can share one file."""
    import fcntl
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = load(path)
        merged["commands"] += [c for c in results["commands"] if c not in merged["commands"]]
        merged["cells"].update(results["cells"])
        tmp = path.parent / f".{path.name}.tmp"
        tmp.write_text(json.dumps(merged, indent=2) + "\n")
        os.replace(tmp, path)


def split_init(init: str) -> tuple[str, str]:
    """``label=model`` -> (label, model); a bare model name is its own label (``pretrained``, ``128x4``)."""
    label, sep, model = init.partition("=")
    return (label, model) if sep else (init, init)


def run_exp(args: argparse.Namespace, init: str, seed: int, results: dict[str, Any], out: Path) -> None:
    import yaml

    from dreamgym.cli.train import parse_overrides
    from dreamgym.experience.fidelity import evaluate_experience_model
    from dreamgym.experience.model import ExperienceModel
    from dreamgym.experience.train import ExpTrainConfig, train_experience_model
    from dreamgym.replay import ReplayBuffer
    from dreamgym.types import read_trajectories

    raw = yaml.safe_load(args.config.read_text())
    for key, value in parse_overrides(args.set).items():  # dotted keys reach into sections: protocol.copy_refs=true
        *path, leaf = key.split(".")
        node = raw
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    cfg = ExpTrainConfig.model_validate(raw)
    init, model_path = split_init(init)
    run = args.work / "exp" / f"{init}-s{seed}"
    every = min(args.points)
    # The config's schedule (epochs, warmup) with the budget as its time limit, as the demo trains it.
    # The budget is --steps optimizer steps, the learning-rate schedule (warmup, cosine) spanning exactly them;
    # --budget seconds only caps the wall time (and cuts it into the --points snapshots).
    sft = cfg.sft_config().model_copy(update={"max_steps": args.steps, "time_budget_s": float(args.time_cap or args.budget),
                                              "num_threads": args.threads, "seed": seed, "save_steps": 100000})
    if not (run / "summary.json").is_file():
        train_experience_model(args.train, model_path, run, cfg.protocol_config(), sft, encoder=cfg.encoder,
                               mixture=cfg.mixture, snapshot_every_s=every, seed=seed)
    summary = json.loads((run / "summary.json").read_text())
    heldout = [t for path in args.heldout for t in read_trajectories(path)]
    buffer = ReplayBuffer.open(run / "buffer", create=False, read_only=True) if (run / "buffer").is_dir() else None
    extra = [t for path in args.extra_heldout or [] for t in read_trajectories(path)]
    snapshots = summary["snapshots"]
    for i, snap in enumerate(snapshots):
        last = i == len(snapshots) - 1
        # the last snapshot is the end of the step budget (or the time cap): the --budget point
        point = args.budget if last else min(args.points, key=lambda p: abs(p - snap["seconds"]))
        key = f"{init}/{point}/{seed}"
        if (not last and abs(point - snap["seconds"]) > every / 2) or key in results["cells"]:
            continue
        t0 = time.monotonic()
        model = ExperienceModel.load(snap["dir"], buffer=buffer)
        report = evaluate_experience_model(model, heldout, max_transitions=args.max_transitions, seed=0)
        cell = {"init": init, "seconds": point, "seed": seed, "train_seconds": snap["seconds"],
                "steps": summary["steps"] if last else None, "epochs": snap["epochs"],
                "train_loss": snap["train_loss"], **{k: report.get(k) for k in EXP_KEYS}}
        if last and extra:  # purchases of every reward, where the majority answer is not 1.0
            report = evaluate_experience_model(model, extra, seed=0)
            cell["extra"] = {k: report.get(k) for k in EXP_KEYS if not isinstance(report.get(k), dict)}
        cell["eval_seconds"] = round(time.monotonic() - t0, 1)
        results["cells"][key] = cell
        save(out, results)
        print(key, {k: results["cells"][key].get(k) for k in EXP_KEYS[:8]}, flush=True)


def run_policy(args: argparse.Namespace, init: str, seed: int, results: dict[str, Any], out: Path) -> None:
    from dreamgym.agent.policy import PolicyConfig, load_policy
    from dreamgym.baselines.sft import train_bc
    from dreamgym.envs.pool import env_factory
    from dreamgym.rl.evaluate import evaluate_policy
    from dreamgym.sft import SFTConfig

    init, model_path = split_init(init)
    key = f"{init}/{args.budget}/{seed}"
    if key in results["cells"]:
        return
    run = args.work / "policy" / f"{init}-s{seed}"
    cfg = PolicyConfig(action_format=args.action_format, offer_task_search=True, answer_by_name=args.answer_by_name)
    sft = SFTConfig(epochs=2.0, max_steps=args.policy_steps, learning_rate=args.policy_lr, batch_size=32,
                    max_length=args.policy_max_length,
                    time_budget_s=float(args.time_cap or args.budget), num_threads=args.threads, seed=seed, save_steps=100000)
    summary = (json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file()
               else train_bc(args.train, model_path, run, sft, cfg, skip_detours=not args.keep_detours))
    t0 = time.monotonic()
    # val needs the shop's val_fraction (0.1: the split the bench uses); test's tasks do not depend on it
    env_kwargs = {"val_fraction": 0.1} if args.eval_split == "val" else {}
    res = evaluate_policy(load_policy(run), env_factory("shop", **env_kwargs), args.eval_split, args.episodes, seed=0,
                          max_steps=15, num_envs=64)
    results["cells"][key] = {"init": init, "seconds": args.budget, "seed": seed, "steps": summary.get("steps"),
                             "epochs": summary.get("epochs"),
                             "train_seconds": summary.get("seconds"), "eval_seconds": round(time.monotonic() - t0, 1),
                             "eval_split": args.eval_split, "examples": summary.get("examples"),
                             **res.to_dict()}
    save(out, results)
    print(key, results["cells"][key], flush=True)


def flat(cell: dict[str, Any]) -> dict[str, Any]:
    """One level of nested dicts (``epsilon_r``, ``next_state_copy_baseline``) as ``outer.inner`` keys."""
    out: dict[str, Any] = {}
    for k, v in cell.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out


def summarise(path: Path) -> None:
    cells = {key: flat(c) for key, c in load(path)["cells"].items()}
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for c in cells.values():
        groups.setdefault((c["init"], c["seconds"]), []).append(c)
    metric_keys = [k for k in dict.fromkeys(k for c in cells.values() for k in c)
                   if k not in ("init", "seconds", "seed") and any(isinstance(c.get(k), (int, float)) for c in cells.values())]
    for (init, seconds), cs in sorted(groups.items()):
        parts = []
        for k in metric_keys:
            xs = [float(c[k]) for c in cs if isinstance(c.get(k), (int, float))]
            if xs:
                m, sd, hw = mean_ci(xs)
                parts.append(f"{k} {m:.3f}±{hw:.3f} (sd {sd:.3f})")
        print(f"{init} @ {seconds}s, n={len(cs)}: " + "; ".join(parts))


def paired(path: Path, against: Path) -> None:
    """Each metric of ``path``'s cells minus ``against``'s, paired by (init, seed), as mean ± 95% t half-width:
    the same model and seeds under two budgets (two ``--out`` files of one ``--inits``)."""
    mine, theirs = ({(c["init"], c["seed"]): flat(c) for c in load(p)["cells"].values()} for p in (path, against))
    for init in sorted({i for i, _ in mine}):
        pairs = [(mine[key], theirs[key]) for key in sorted(mine) if key[0] == init and key in theirs]
        if not pairs:
            continue
        parts = []
        for k in pairs[0][0]:
            if k in ("seed", "seconds") or not all(isinstance(c.get(k), (int, float)) for pair in pairs for c in pair):
                continue
            m, _, hw = mean_ci([float(a[k]) - float(b[k]) for a, b in pairs])
            parts.append(f"{k} {m:+.3f}±{hw:.3f}")
        print(f"{init}, {len(pairs)} seeds, {path.name} minus {against.name}: " + "; ".join(parts))


MARKDOWN_EXP = [("epochs", "epochs"), ("click_consistency", "click consistency"),
                ("reward_consistency", "grounded reward consistency"),
                ("terminal_reward_accuracy", "terminal reward acc (±0.1)"),
                ("terminal_reward_majority_baseline", "its majority"), ("done_accuracy", "done acc"),
                ("done_majority_baseline", "its majority"), ("invalid_output_rate", "invalid"),
                ("next_state_f1", "next-state F1"), ("extra.terminal_reward_accuracy", "noise-0.8 terminal acc"),
                ("extra.terminal_reward_majority_baseline", "its majority")]
MARKDOWN_POLICY = [("epochs", "epochs"), ("success_rate", "greedy test success"), ("mean_reward", "mean reward"),
                   ("invalid_action_rate", "invalid actions")]
# envs without the shop's copy checks (TextWorld): the env-independent fidelity columns
MARKDOWN_GENERIC = [("epochs", "epochs"), ("done_accuracy", "done acc"), ("done_majority_baseline", "its majority"),
                    ("reward_accuracy", "reward acc"), ("reward_majority_baseline", "its majority"),
                    ("invalid_output_rate", "invalid"), ("next_state_exact", "next-state exact"),
                    ("next_state_f1", "next-state F1"), ("next_state_copy_baseline.f1", "F1 of copying the state")]


def markdown(path: Path) -> None:
    """The README's table: one row per (init, snapshot), each cell mean ± 95% t half-width over the seeds."""
    cells = {key: flat(c) for key, c in load(path)["cells"].items()}
    if not any("next_state_f1" in c for c in cells.values()):
        cols = MARKDOWN_POLICY
    elif any(isinstance(c.get("click_consistency"), (int, float)) for c in cells.values()):
        cols = MARKDOWN_EXP
    else:
        cols = MARKDOWN_GENERIC
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for c in cells.values():
        groups.setdefault((c["init"], c["seconds"]), []).append(c)
    print("| init | budget point | seeds | " + " | ".join(name for _, name in cols) + " |")
    print("|---" * (3 + len(cols)) + "|")
    for (init, seconds), cs in sorted(groups.items()):
        row = [init, f"{seconds} s", str(len(cs))]
        for key, _ in cols:
            xs = [float(c[key]) for c in cs if isinstance(c.get(key), (int, float))]
            if not xs:
                row.append("")
                continue
            m, _, hw = mean_ci(xs)
            row.append(f"{m:.2f}" if len(xs) == 1 or math.isnan(hw) else f"{m:.2f} ± {hw:.2f}")
        print("| " + " | ".join(row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["exp", "policy"], required=True)
    parser.add_argument("--train", nargs="+", type=Path)
    parser.add_argument("--heldout", nargs="+", type=Path)
    parser.add_argument("--config", type=Path, default=Path("configs/exp-shop-tiny.yaml"))
    parser.add_argument("--inits", nargs="+", default=["pretrained", "128x4"],
                        help="models to start from: a name (pretrained, 128x4) or label=path")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=600, help="cap on fine-tuning seconds")
    parser.add_argument("--time-cap", type=int, default=None,
                        help="safety cap on training seconds (default: --budget); raise it on a busy machine so that "
                        "the step budget, not the load, decides the model (the cells keep the --budget label)")
    parser.add_argument("--steps", type=int, default=150,
                        help="exp: optimizer steps (batch 16; 150 took <= 600 s on one shared core)")
    parser.add_argument("--policy-steps", type=int, default=125,
                        help="policy: optimizer steps (batch 32; 125 took <= 600 s on one shared core)")
    parser.add_argument("--extra-heldout", nargs="+", type=Path,
                        help="exp: a second held-out set, scored at the end of the budget (key 'extra')")
    parser.add_argument("--points", nargs="+", type=int, default=[150, 300, 600], help="exp: snapshot seconds")
    parser.add_argument("--max-transitions", type=int, default=None, help="exp: held-out steps scored (all)")
    parser.add_argument("--episodes", type=int, default=200, help="policy: test episodes")
    parser.add_argument("--eval-split", choices=["test", "val"], default="test",
                        help="policy: the split of the evaluation tasks (choose settings on val)")
    parser.add_argument("--policy-max-length", type=int, default=512,
                        help="policy: tokens per BC example (longer prompts lose their start, the task)")
    parser.add_argument("--answer-by-name", action="store_true",
                        help="policy: clone option and button clicks as their text (PolicyConfig.answer_by_name)")
    parser.add_argument("--action-format", choices=["index", "typed"], default="index",
                        help="policy: PolicyConfig.action_format (typed: answer an option's element type and rank)")
    parser.add_argument("--keep-detours", action="store_true",
                        help="policy: clone a noisy policy's random detour steps too (as before detours were recorded)")
    parser.add_argument("--policy-lr", type=float, default=2e-3, help="policy: BC learning rate (the base's pre-training one; not tuned)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="exp: override a field of --config (dotted: protocol.copy_refs=true); repeat")
    parser.add_argument("--work", type=Path, default=Path("runs/pretrained_base"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--summarise", action="store_true")
    parser.add_argument("--against", type=Path, default=None,
                        help="with --summarise: print --out's cells minus this file's, paired by init and seed")
    parser.add_argument("--markdown", action="store_true", help="print the README table (mean ± 95%% CI)")
    args = parser.parse_args()
    out = args.out or RESULTS / f"pretrained_base_{args.part}.json"
    if args.summarise or args.markdown:
        (markdown if args.markdown else summarise)(out)
        if args.against:
            paired(out, args.against)
        return
    torch.set_num_threads(args.threads)
    results = load(out)
    results["commands"].append(" ".join(sys.argv))
    for seed in args.seeds:
        for init in args.inits:
            (run_exp if args.part == "exp" else run_policy)(args, init, seed, results, out)
    summarise(out)


if __name__ == "__main__":
    main()
