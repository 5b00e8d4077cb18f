"""The wall-clock trade DreamGym exists for (issue 13, item 5): real steps that cost seconds, as on websites.

On a finished bench seed (``dreamgym bench --out B``, here ``B/seed<k>``) this reruns the GRPO-real row from the
same SFT policy with the same RL settings and seed, but with every real reset and step sleeping ``--latency`` s and
at most ``--sessions`` at once (``RLConfig.real_latency_s`` / ``real_sessions``; WebArena-like: 1 s, 4 sessions).
Its rollouts are those of the bench's row (same seed), so only the clock differs. Then it reads, for both rows,
eval success against wall-clock (the start's evaluation at 0 s) and reports the wall-clock at which each first reaches GRPO-real's final success:

- GRPO-real: its run's cumulative ``wall_s`` at each evaluation (latency paid, evaluation exempt);
- DreamGym: M_exp's training time (the ``train_exp`` stage) plus the dream run's ``wall_s`` (the dream pays no
  latency), and, separately, what collecting the offline data would cost at the same latency with the same
  sessions (``(episodes + transitions) x latency / sessions``, a lower bound: perfect packing): the data the SFT
  policy both rows start from, and apart the extra behaviours' episodes that only M_exp trains on.

    .venv/bin/python benchmarks/latency_trade.py --seed-dir runs/bench/seed0 --latency 1 --sessions 4

Writes ``--out`` (default benchmarks/results/latency_trade.json, with the command).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from dreamgym.rl.trainer import RLConfig, train


def curve(run: Path, offset: float = 0.0) -> list[dict[str, float]]:
    """Every evaluation of an RL run (summary.json's ``evals``, the start's included, at wall-clock 0) with the
    run's cumulative wall-clock at it (metrics.jsonl), shifted by ``offset``."""
    wall = {r["iteration"]: float(r["wall_s"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    evals = json.loads((run / "summary.json").read_text())["evals"]
    return [{"iteration": e["iteration"], "wall_s": offset + wall.get(e["iteration"], 0.0),
             "eval_success": float(e["success_rate"]), "eval_reward": float(e["mean_reward"]),
             "real_transitions": e.get("real_transitions", 0)} for e in evals]


def first_reaching(points: list[dict[str, float]], target: float) -> float | None:
    return next((p["wall_s"] for p in points if p["eval_success"] >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed-dir", type=Path, required=True, help="a finished bench seed: B/seed<k>")
    ap.add_argument("--latency", type=float, default=1.0, help="seconds per real reset and step")
    ap.add_argument("--sessions", type=int, default=4, help="real sessions at once")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "latency_trade.json")
    args = ap.parse_args()
    seed_dir = args.seed_dir
    demo = yaml.safe_load((seed_dir / "demo_config.yaml").read_text())
    run = seed_dir / f"grpo_real_latency{args.latency:g}x{args.sessions}"
    if not (run / "summary.json").exists():
        cfg = RLConfig.model_validate({"max_steps": demo["max_steps"], **demo["rl"], "env": demo["env"],
                                       "env_kwargs": demo["env_kwargs"], "seed": demo["seed"],
                                       "eval_episodes": demo["eval_episodes"], "init": str(seed_dir / "sft"),
                                       "real_latency_s": args.latency, "real_sessions": args.sessions})
        train(cfg, run, resume=(run / "checkpoint").exists())
    real = curve(run)
    fast = curve(seed_dir / "grpo_real")
    exp_s = float(json.loads((seed_dir / "stages" / "train_exp.json").read_text())["stage_seconds"])
    dream = curve(seed_dir / "dreamgym", offset=exp_s)
    collect = json.loads((seed_dir / "stages" / "collect.json").read_text())
    def collection_s(data: dict[str, Any]) -> float:  # every reset and step of its episodes, perfectly packed
        return float(data["trajectories"] + data["transitions"]) * args.latency / args.sessions

    offline_s = collection_s(collect)
    # the extra behaviours' episodes (DemoConfig.extra_behaviour) are M_exp's data only: a cost of the dream alone
    # (their own stage, collect_extra, since session 20; in collect's marker before)
    extra_marker = seed_dir / "stages" / "collect_extra.json"
    extra_data = json.loads(extra_marker.read_text()) if extra_marker.exists() else collect
    extra = [{**e, "collection_s_at_this_latency": collection_s(e)} for e in extra_data.get("extra", [])]
    extra_s = sum(e["collection_s_at_this_latency"] for e in extra)
    target = real[-1]["eval_success"]
    summary = json.loads((run / "summary.json").read_text())
    result: dict[str, Any] = {
        "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "seed_dir": str(seed_dir), "latency_s": args.latency, "sessions": args.sessions,
        "grpo_real_final_success": target,
        "grpo_real": {"curve": real, "real_transitions": summary["real_transitions"],
                      # per iteration, where the wall-clock went (a slow iteration shows a busy machine)
                      "iterations": [{k: r[k] for k in ("iteration", "generation_s", "env_s", "update_s", "wall_s")
                                      if k in r} for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())],
                      "real_wait_s": summary["real_wait_s"], "wall_s": summary["wall_s"],
                      "reaches_target_at_s": first_reaching(real, target),
                      # the same seed and settings as the bench's row: only the clock may differ
                      "same_evaluations_as_the_bench_row": [(p["eval_success"], p["eval_reward"]) for p in real] ==
                      [(p["eval_success"], p["eval_reward"]) for p in fast]},
        "dreamgym": {"curve": dream, "train_exp_s": exp_s, "reaches_target_at_s": first_reaching(dream, target),
                     "final_success": dream[-1]["eval_success"] if dream else None},
        # the SFT policy's data, which both rows start from (M_exp's too)
        "offline_data": {"trajectories": collect["trajectories"], "transitions": collect["transitions"],
                         "collection_s_at_this_latency": offline_s},
        "m_exp_only_offline_data": {"behaviours": extra, "collection_s_at_this_latency": extra_s},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"GRPO-real at {args.latency:g} s/step, {args.sessions} sessions: final success {target:.3f} after "
          f"{summary['wall_s']:.0f} s ({summary['real_transitions']} real transitions, {summary['real_wait_s']:.0f} "
          f"session-s of latency)")
    at = result["dreamgym"]["reaches_target_at_s"]
    print(f"DreamGym reaches it at {'never (final ' + format(dream[-1]['eval_success'], '.3f') + ')' if at is None else format(at, '.0f') + ' s'}"
          f" (M_exp {exp_s:.0f} s + dream); at this latency the offline data both rows start from would take >= "
          f"{offline_s:.0f} s to collect" + (f", and M_exp's own extra episodes >= {extra_s:.0f} s more" if extra else ""))


if __name__ == "__main__":
    main()
