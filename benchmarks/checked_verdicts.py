"""Checked verdicts (``ProtocolConfig.checked_verdicts``): the same trained M_exp, its purchase verdicts as it writes
them vs recomputed by the shop's trace checker from the text it compares (``dreamgym/envs/shop/recheck.py``).

    .venv/bin/python benchmarks/checked_verdicts.py --runs runs/recheck/B/exp/pretrained-s0 ... \\
        --heldout data/base/val_ann.jsonl --extra-heldout data/mix/val_n08_ann.jsonl \\
        [--policy runs/onpath/p-s0 --dream-data data/base/train_v_ann.jsonl --episodes 64] --out runs/recheck/val.json

For each run (an M_exp directory with its ``buffer/`` one level up, as ``benchmarks/pretrained_base.py --part exp``
writes them) both arms score the same generations: the model's outputs are memoised by prompt and sampling
parameters, and the checker only reads an output after it parses, so the arms differ in how the outputs are read
and nothing else (a paired comparison with no sampling noise between the arms). Scored:

* the teacher-forced fidelity report (``evaluate_experience_model``) on ``--heldout`` (noise 0.5: most purchases
  right) and ``--extra-heldout`` (noise 0.8: purchases of every reward), each accuracy beside its majority answer;
* with ``--policy``: ``wm2real``, the policy's greedy dreamt episodes on the first ``--episodes`` distinct tasks of
  ``--dream-data`` replayed in the real shop (how often the dreamt and real final rewards agree within 0.1).

``--operands`` also counts, per run, the held-out purchases whose trace writes each check's operands as the
annotation does (``operands`` in the run's cell): what the checker can only be as right as.

``--oracle-operands DATA...`` needs no model: per file, whether the checker leaves every annotated purchase trace as
it is, and how often a trace with the annotation's operands but ``y`` for every check and ``1.00`` is scored within
0.1 of the real reward once checked, beside the majority answer's (1.0) rate (``oracle_operands``).

``--summarise`` prints each metric's mean and 95% t interval over the runs, per arm, and the paired difference.
Results go to ``--out`` run by run (a rerun skips the runs it holds).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:  # run as a script (benchmarks/ on sys.path) or as benchmarks.checked_verdicts
    from pretrained_base import mean_ci  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    from benchmarks.pretrained_base import mean_ci

KEYS = ("terminal_reward_accuracy", "terminal_reward_majority_baseline", "terminal_reward_exact_accuracy",
        "reward_consistency", "reward_accuracy", "reward_majority_baseline", "done_accuracy",
        "done_majority_baseline", "click_consistency", "option_consistency", "invalid_output_rate", "next_state_f1",
        "terminal_transitions")
WM2REAL_KEYS = ("reward_agreement", "success_agreement", "dreamt_success_rate", "real_success_rate",
                "dreamt_mean_final_reward", "real_mean_final_reward", "diverged")
ARMS = ("model", "checked")


class MemoLLM:
    """An LLM whose generations are memoised by prompt and sampling parameters (both arms read the same outputs)."""

    def __init__(self, llm: Any) -> None:
        self.llm, self.memo = llm, {}  # type: ignore[var-annotated]
        self.tokenizer = llm.tokenizer
        self.max_length = getattr(llm, "max_length", None)

    def encode(self, prompt: Any) -> Any:
        return self.llm.encode(prompt)

    def generate(self, prompts: Sequence[Any], params: Any) -> list[Any]:
        keys = [(json.dumps(p, sort_keys=True), repr(params)) for p in prompts]
        todo = [i for i, k in enumerate(keys) if k not in self.memo]
        if todo:
            for i, c in zip(todo, self.llm.generate([prompts[i] for i in todo], params), strict=True):
                self.memo[keys[i]] = c
        return [self.memo[k] for k in keys]


def load_run(run: Path) -> Any:
    """The run's M_exp (its last snapshot, if it took any) over its own replay buffer."""
    from dreamgym.experience.model import ExperienceModel
    from dreamgym.replay import ReplayBuffer

    buffer = ReplayBuffer.open(run / "buffer", create=False, read_only=True) if (run / "buffer").is_dir() else None
    snapshots = json.loads((run / "summary.json").read_text()).get("snapshots") if (run / "summary.json").is_file() else None
    return ExperienceModel.load(snapshots[-1]["dir"] if snapshots else run, buffer=buffer)


def score_run(args: argparse.Namespace, run: Path) -> dict[str, Any]:
    from dreamgym.agent.policy import load_policy
    from dreamgym.experience.fidelity import evaluate_experience_model
    from dreamgym.experience.model import ExperienceConfig, ExperienceModel
    from dreamgym.rl.wm2real import policy_wm2real
    from dreamgym.types import read_trajectories

    base = load_run(run)
    buffer, llm = base.buffer, MemoLLM(base.llm)
    sets = {"heldout": args.heldout, "extra": args.extra_heldout or []}
    data = {name: [t for p in paths for t in read_trajectories(p)] for name, paths in sets.items() if paths}
    policy = load_policy(args.policy) if args.policy else None
    dream_data = [t for p in args.dream_data or [] for t in read_trajectories(p) if t.transitions]
    out: dict[str, Any] = {}
    for arm in ARMS:
        protocol = {**base.cfg.protocol, "checked_verdicts": arm == "checked"}
        cfg = ExperienceConfig(**{**base.cfg.model_dump(), "protocol": protocol, "env": args.env})
        model = ExperienceModel(llm, cfg, buffer)  # type: ignore[arg-type]
        cell: dict[str, Any] = {}
        for name, trajs in data.items():
            t0 = time.monotonic()
            report = evaluate_experience_model(model, trajs, seed=0)
            cell[name] = {k: report.get(k) for k in KEYS} | {"seconds": round(time.monotonic() - t0, 1)}
        if policy is not None:
            t0 = time.monotonic()
            w = policy_wm2real(model, policy, dream_data, args.episodes, seed=0, max_steps=15)
            cell["wm2real"] = {k: w.get(k) for k in WM2REAL_KEYS} | {"seconds": round(time.monotonic() - t0, 1)}
        cell["model_stats"] = model.stats_dict()
        out[arm] = cell
        print(run, arm, json.dumps(cell), flush=True)
    return out


def interval(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}" if values else "-"
    mean, _, half = mean_ci(values)
    return f"{mean:.3f} ± {half:.3f}"


def purchase_steps(paths: Sequence[Path]) -> list[tuple[Any, int]]:
    """(trajectory, step) of every annotated purchase (a trace that starts with ``buy``, after any goal head) in
    ``paths``."""
    from dreamgym.envs.shop.recheck import split_goal
    from dreamgym.types import read_trajectories

    return [(t, i) for p in paths for t in read_trajectories(p) for i, x in enumerate(t.transitions)
            if split_goal(str(x.info.get("reasoning") or ""))[1].startswith("buy")]


def oracle_operands(paths: Sequence[Path]) -> dict[str, Any]:
    from dreamgym.envs.shop.recheck import recheck_purchase
    from dreamgym.types import ExperiencePrediction

    out = {}
    for path in paths:
        unchanged = within = majority = 0
        steps = purchase_steps([path])
        for traj, i in steps:
            x = traj.transitions[i]
            trace = x.info["reasoning"]
            real = recheck_purchase(x.state, x.action, ExperiencePrediction(trace, x.next_state, x.reward, True,
                                                                            x.reward >= 1 - 1e-9))
            unchanged += real is not None and (real.reasoning, real.next_state) == (trace, x.next_state) \
                and abs(real.reward - x.reward) <= 0.005 + 1e-9
            lazy = re.sub(r"score .* -> done$", "score 1/1=1.00 -> done", re.sub(r" n(?=;)", " y", trace))
            checked = recheck_purchase(x.state, x.action, ExperiencePrediction(lazy, x.next_state, 1.0, True, True))
            within += checked is not None and abs(checked.reward - x.reward) <= 0.1
            majority += abs(1.0 - x.reward) <= 0.1
        n = max(len(steps), 1)
        out[str(path)] = {"purchases": len(steps), "unchanged": unchanged, "all_yes_checked_within_0.1": within / n,
                          "majority_within_0.1": majority / n}
    return out


def operands(model: Any, paths: Sequence[Path]) -> dict[str, Any]:
    """Of the held-out purchases, how many traces write each check kind's operands as the annotation does."""
    from dreamgym.envs.shop.recheck import split_goal
    from dreamgym.experience.protocol import ExperienceQuery

    def by_kind(trace: str | None) -> dict[str, list[str]]:
        kinds = defaultdict(list)
        for clause in split_goal(trace or "")[1].split("; ")[1:-1]:
            kind, _, body = clause.partition(" ")
            body = body.rsplit(" ", 2 if kind == "attr" else 1)[0]  # without the verdict (and title/unseen)
            kinds[kind].append(body)
        return kinds

    steps = purchase_steps(paths)
    preds = model.predict([ExperienceQuery.at_step(t, i) for t, i in steps], seed=0)
    right: Counter[str] = Counter()
    for (traj, i), pred in zip(steps, preds, strict=True):
        real, dreamt = by_kind(traj.transitions[i].info["reasoning"]), by_kind(pred.reasoning)
        for kind in ("type", "attr", "opt", "price"):
            right[kind] += real[kind] == dreamt[kind]
        right["task type"] += [b.split("=")[0] for b in real["type"]] == [b.split("=")[0] for b in dreamt["type"]]
        right["item price"] += [b.split("<=")[0] for b in real["price"]] == [b.split("<=")[0] for b in dreamt["price"]]
    return {"purchases": len(steps), **right}


def summarise(results: dict[str, Any]) -> None:
    runs = list(results["runs"].values())
    for part, keys in (("heldout", KEYS), ("extra", KEYS), ("wm2real", WM2REAL_KEYS)):
        if not all(part in r["model"] for r in runs):
            continue
        print(f"## {part} ({len(runs)} runs; mean ± 95% t half-width; paired difference checked - model)")
        for k in keys:
            vals = {arm: [r[arm][part][k] for r in runs if r[arm][part].get(k) is not None] for arm in ARMS}
            diff = [c - m for m, c in zip(vals["model"], vals["checked"], strict=True)]
            print(f"{k:36s} model {interval(vals['model']):>16s}   checked {interval(vals['checked']):>16s}   "
                  f"diff {interval(diff):>16s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", type=Path, default=[])
    parser.add_argument("--heldout", nargs="+", type=Path, default=[])
    parser.add_argument("--extra-heldout", nargs="+", type=Path)
    parser.add_argument("--policy", type=Path, help="a policy run for wm2real (needs --dream-data)")
    parser.add_argument("--dream-data", nargs="+", type=Path, help="wm2real: trajectories whose tasks are dreamt")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--env", default="shop")
    parser.add_argument("--operands", action="store_true", help="count the right operands of each run's purchases")
    parser.add_argument("--oracle-operands", nargs="+", type=Path, help="the checker on annotated data (no model)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summarise", action="store_true")
    args = parser.parse_args()
    if args.policy and not args.dream_data:
        parser.error("--policy needs --dream-data")
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {"commands": [], "runs": {}}
    if args.runs or args.oracle_operands:
        import shlex
        import sys

        results["commands"].append("python " + " ".join(shlex.quote(a) for a in sys.argv))
    for run in args.runs:
        if not run.is_dir():
            parser.error(f"{run}: not a model directory")
        cell = results["runs"].get(str(run)) or score_run(args, run)
        if args.operands and "operands" not in cell:
            cell["operands"] = operands(load_run(run), args.heldout)
            print(run, "operands", cell["operands"], flush=True)
        results["runs"][str(run)] = cell
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    if args.oracle_operands:
        results["oracle_operands"] = oracle_operands(args.oracle_operands)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
        print(json.dumps(results["oracle_operands"], indent=1))
    if args.summarise:
        summarise(results)


if __name__ == "__main__":
    main()
