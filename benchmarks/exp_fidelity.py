"""Ablations of the experience model, one command: with vs without retrieval, with vs without reasoning.

    .venv/bin/python benchmarks/exp_fidelity.py --train data/exp/train.jsonl --heldout data/exp/heldout.jsonl \
        --config configs/exp-shop-tiny.yaml --time-budget 900 --max-transitions 300

Trains one experience model per variant from the same config, data, seed and time budget (``--time-budget``
seconds of training each, run one after another), evaluates each on the same held-out steps with
``evaluate_experience_model`` and writes ``benchmarks/results/exp_fidelity.json`` (the command, the config,
each variant's training summary and fidelity report). Variants (the paper's ablations):

* ``full``: the config as is, with ``--k`` retrieved neighbours (a hashing-encoder buffer on the training data);
* ``no_retrieval``: k = 0;
* ``no_reasoning``: no ``<think>`` trace in the target (with retrieval);
* ``no_target`` (opt in): without the prompt's TARGET line (``ground_action=False``), with retrieval.

``--snapshot-every S`` also snapshots the ``full`` variant every S training seconds and evaluates each snapshot
(fidelity against training time, in ``variants.full.curve``).

With ``--curve RUN_DIR`` it instead evaluates every snapshot of a ``train-exp --snapshot-every`` run (fidelity
against training time) and writes ``benchmarks/results/exp_curve.json``:

    .venv/bin/python benchmarks/exp_fidelity.py --curve runs/exp/main --heldout data/exp/heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from dreamgym.experience.fidelity import evaluate_experience_model
from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.train import ExpTrainConfig, read_training_data, train_experience_model
from dreamgym.replay import ReplayBuffer

RESULTS = Path(__file__).parent / "results" / "exp_fidelity.json"
CURVE = Path(__file__).parent / "results" / "exp_curve.json"
KEYS = ("terminal_reward_accuracy", "terminal_reward_majority_baseline", "reward_accuracy", "reward_mae",
        "done_accuracy", "invalid_output_rate", "next_state_f1", "click_consistency", "option_consistency",
        "reward_consistency", "epsilon_p", "reasoning_exact", "steps_per_s")


def variants(base: ExpTrainConfig, k: int) -> dict[str, ExpTrainConfig]:
    def with_protocol(**fields: Any) -> ExpTrainConfig:
        return base.model_copy(update={"protocol": {**base.protocol, **fields}})

    return {
        "full": with_protocol(k=k, reasoning=True),
        "no_retrieval": with_protocol(k=0, reasoning=True),
        "no_reasoning": with_protocol(k=k, reasoning=False),
        "no_target": with_protocol(k=k, reasoning=True, ground_action=False),
    }


def load(model_dir: Path, buffer_dir: Path | None = None) -> ExperienceModel:
    """The model, with its training run's buffer when it retrieves (a snapshot shares its run's buffer)."""
    model = ExperienceModel.load(model_dir)
    if model.protocol.k > 0:
        model.buffer = ReplayBuffer.open(buffer_dir or model_dir / "buffer", create=False, read_only=True)
    return model


def snapshot_points(summary: dict[str, Any], heldout: list[Any], max_transitions: int) -> list[dict[str, Any]]:
    """The fidelity of each snapshot of a training run (its summary) on the same held-out steps."""
    points = []
    for snap in summary["snapshots"]:
        snap_dir = Path(snap["dir"])  # RUN/snapshots/<seconds>s
        report = evaluate_experience_model(load(snap_dir, snap_dir.parent.parent / "buffer"), heldout,
                                           max_transitions, seed=0)
        points.append({"train_seconds": snap["seconds"], "epochs": snap["epochs"], "train_loss": snap["train_loss"],
                       **{key: report.get(key) for key in KEYS}, "next_state_f1_by_page": report["next_state_f1_by_page"],
                       "report": report})
        print(json.dumps({k: v for k, v in points[-1].items() if k != "report"}), flush=True)
    return points


def curve(run: Path, heldout: list[Any], max_transitions: int, out_path: Path, threads: int) -> None:
    """Evaluate each snapshot of ``run`` (and the final model) on the same held-out steps."""
    torch.set_num_threads(threads)
    summary = json.loads((run / "summary.json").read_text())
    points = snapshot_points(summary, heldout, max_transitions)
    out = {"command": " ".join([".venv/bin/python", *sys.argv]), "run": str(run), "train_summary": summary,
           "points": points}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", nargs="+", help="annotated training trajectories")
    parser.add_argument("--heldout", nargs="+", required=True, help="held-out real trajectories")
    parser.add_argument("--config", type=Path, default=Path("configs/exp-shop-tiny.yaml"))
    parser.add_argument("--time-budget", type=float, default=900.0, help="training seconds per variant")
    parser.add_argument("--k", type=int, default=2, help="neighbours of the variants with retrieval")
    parser.add_argument("--max-transitions", type=int, default=300)
    parser.add_argument("--variants", nargs="+", default=["full", "no_retrieval", "no_reasoning"])
    parser.add_argument("--work", type=Path, default=Path("runs/exp_fidelity"))
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default benchmarks/results/...)")
    parser.add_argument("--curve", type=Path, help="evaluate the snapshots of this train-exp run instead")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--snapshot-every", type=float, default=None,
                        help="also snapshot the full variant every this many training seconds and evaluate each")
    args = parser.parse_args()
    heldout = read_training_data(args.heldout)
    if args.curve is not None:
        curve(args.curve, heldout, args.max_transitions, args.out or CURVE, args.threads)
        return
    if not args.train:
        parser.error("--train is required to train the variants")
    args.out = args.out or RESULTS

    base = ExpTrainConfig.model_validate(yaml.safe_load(args.config.read_text()) or {})
    # Same schedule for every variant: the config's epochs are sized to its own budget, so scale them with it.
    sft = dict(base.sft)
    if sft.get("time_budget_s") and "epochs" in sft:
        sft["epochs"] = sft["epochs"] * args.time_budget / sft["time_budget_s"]
    sft["time_budget_s"] = args.time_budget
    base = base.model_copy(update={"sft": sft, "snapshot_every_s": None})
    out: dict[str, Any] = {"command": " ".join([".venv/bin/python", *sys.argv]), "config": base.model_dump(),
                           "variants": {}}
    for name in args.variants:
        cfg = variants(base, args.k)[name]
        model_dir = args.work / name
        if (model_dir / "summary.json").exists():  # trained by an earlier, interrupted run of this command
            summary = json.loads((model_dir / "summary.json").read_text())
            print(f"{name}: reusing the model trained in {model_dir}", flush=True)
        else:
            summary = train_experience_model(
                args.train, cfg.model, model_dir, cfg.protocol_config(), cfg.sft_config(), encoder=cfg.encoder,
                chat=cfg.chat, vocab_size=cfg.vocab_size, mixture=cfg.mixture, seed=cfg.seed,
                snapshot_every_s=args.snapshot_every if name == "full" else None)
        torch.set_num_threads(args.threads)
        report = evaluate_experience_model(load(model_dir), heldout, args.max_transitions, seed=0)
        out["variants"][name] = {"protocol": cfg.protocol, "train": summary, "fidelity": report}
        if summary.get("snapshots"):
            out["variants"][name]["curve"] = snapshot_points(summary, heldout, args.max_transitions)
        print(name, json.dumps({key: report.get(key) for key in KEYS}), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2))  # after every variant: a partial run keeps its results
    table = {name: {key: v["fidelity"].get(key) for key in KEYS} for name, v in out["variants"].items()}
    out["table"] = table
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
