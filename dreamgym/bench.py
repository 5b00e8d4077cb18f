"""``dreamgym bench``: the demo's table over several seeds, with confidence intervals and paired tests vs SFT.

The demo pipeline (:func:`dreamgym.pipeline.run_demo`) runs once per seed into ``OUT/seed<k>/``, its stages keyed
and cached there, so a rerun resumes stage by stage. Every row's final evaluation keeps its per-episode outcomes
(``eval_tasks.json``: task_id, success, reward) on the seed's test tasks in the same seeded order, so the rows of a
seed pair up task by task. :mod:`dreamgym.stats` turns them into ``OUT/bench.json`` and ``OUT/bench.md``: each
row's success rate and mean reward with a 95% CI (bootstrap over seeds, then tasks), and its difference from SFT
on the same tasks (paired bootstrap CI, two-sided exact sign test). A random policy on the same tasks is recorded as
the trivial baseline.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dreamgym.pipeline import ABLATION_ROWS, ROWS, DemoConfig, demo_config, parse_rows, run_demo
from dreamgym.report import ABLATION_COLUMNS, write_bench_report
from dreamgym.stats import RESAMPLES, SEED, bootstrap_ci, paired_bootstrap_ci, sign_test

DEFAULT_SEEDS = (0, 1, 2)
BENCH_FIELDS = ("env", "seed", "rows")  # set by the bench's own options, not by --set / --config


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]`` (non-negative integers, no repeats); a one-line ValueError otherwise."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            seed = int(part)
        except ValueError:
            raise ValueError(f"--seeds expects comma-separated integers like 0,1,2, got {text!r}") from None
        if seed < 0:
            raise ValueError(f"--seeds: a seed must be >= 0, got {seed}")
        if seed in seeds:
            raise ValueError(f"--seeds: seed {seed} is given twice")
        seeds.append(seed)
    return seeds


def check_env(env: str) -> None:
    from dreamgym.envs import find_spec, registered

    if find_spec(env) is None:
        raise ValueError(f"unknown env {env!r}; registered: {', '.join(registered())}")


def bench_configs(env: str, seeds: Sequence[int], rows: Sequence[str], profile: str,
                  overrides: dict[str, Any] | None = None, config: Path | None = None) -> list[DemoConfig]:
    """One DemoConfig per seed (checked before anything runs)."""
    check_env(env)
    given = set(overrides or {})
    if config is not None:
        from dreamgym.types import read_yaml_mapping

        given |= set(read_yaml_mapping(config, "demo config"))
    clash = sorted(given & set(BENCH_FIELDS))
    if clash:
        raise ValueError(f"{', '.join(clash)}: set by the bench's --env/--seeds/--rows, not by --set or --config")
    return [demo_config(profile, {**(overrides or {}), "env": env, "seed": s, "rows": list(rows)}, config)
            for s in seeds]


def _per_task(run: Path, row: str) -> list[dict[str, Any]]:
    path = run / row / "eval_tasks.json"
    if not path.exists():
        raise ValueError(f"{path} is missing (a stage made before per-task results were kept): delete "
                         f"{run / row} and {run / 'stages' / (row + '.json')} and rerun to redo that row")
    return list(json.loads(path.read_text())["per_task"])


def random_baseline(cfg: DemoConfig, run: Path) -> dict[str, Any] | None:
    """The random policy on the seed's test tasks (the SFT evaluation's episodes and seed), cached in
    ``RUN/random_baseline.json``; None where the env has no random policy."""
    from dreamgym.collect import iter_episodes, per_task_results, summarize
    from dreamgym.envs import make

    path = run / "random_baseline.json"
    if path.exists():
        return dict(json.loads(path.read_text()))
    env = make(cfg.env, **cfg.env_kwargs)
    try:
        try:
            policy = env.scripted_policy("random", seed=cfg.seed)
        except ValueError:
            return None
        trajs = list(iter_episodes(env, policy, cfg.eval_episodes, "test", cfg.seed))
    finally:
        env.close()
    result = {**summarize(trajs).to_dict(), "per_task": per_task_results(trajs)}
    path.write_text(json.dumps(result, indent=1))
    return result


def seed_facts(run: Path) -> dict[str, Any]:
    """A seed's stage seconds (each stage's marker; their sum is the demo's length) and M_exp's held-out fidelity
    (``table.json``), so that bench.json says how long a seed took and how faithful its dream was."""
    seconds = {p.stem: json.loads(p.read_text()).get("stage_seconds") for p in sorted((run / "stages").glob("*.json"))
               if not p.name.endswith(".started.json")}
    table = json.loads((run / "table.json").read_text()) if (run / "table.json").exists() else {}
    return {"stage_seconds": seconds, "total_seconds": round(sum(v for v in seconds.values() if v), 1),
            "fidelity": table.get("fidelity")}


def _series(values: list[float]) -> dict[str, Any]:
    return {"per_seed": values, "mean": sum(values) / len(values)}


def summarize_bench(runs: dict[int, Path], rows: Sequence[str], resamples: int = RESAMPLES,
                    seed: int = SEED) -> list[dict[str, Any]]:
    """Each row's numbers over the seeds' run dirs (``runs``: seed -> RUN); the rows of a seed must have played the
    same tasks in the same order (a ValueError otherwise)."""
    tasks = {s: _per_task(run, "sft") for s, run in runs.items()}
    full = {s: _per_task(run, "dreamgym") for s, run in runs.items()} if "dreamgym" in rows else None
    out = []
    for row in rows:
        markers = {s: json.loads((run / "stages" / f"{row}.json").read_text()) for s, run in runs.items()}
        per_task = {s: tasks[s] if row == "sft" else _per_task(run, row) for s, run in runs.items()}
        success = [[float(t["success"]) for t in per_task[s]] for s in runs]
        reward = [[float(t["reward"]) for t in per_task[s]] for s in runs]
        entry: dict[str, Any] = {
            "row": row, "method": markers[next(iter(runs))]["method"],
            "real_transitions": _series([int(m["real_transitions"]) for m in markers.values()]),
            "synthetic_transitions": _series([int(m.get("synthetic_transitions") or 0) for m in markers.values()]),
            "seconds": _series([float(m["stage_seconds"]) for m in markers.values()]),
            "success_rate": bootstrap_ci(success, resamples, seed),
            "mean_reward": bootstrap_ci(reward, resamples, seed),
            "vs_sft": None,
            "per_task": {f"seed{s}": per_task[s] for s in runs},
        }
        if row != "sft":  # a ValueError where the row and SFT played different tasks
            entry["vs_sft"] = paired(per_task, tasks, resamples, seed)
        if row in ABLATION_ROWS and full is not None:  # this row minus DreamGym: negative where the component helps
            entry["vs_dreamgym"] = paired(per_task, full, resamples, seed)
        out.append(entry)
    return out


def paired(rows: Mapping[Any, list[dict[str, Any]]], ref: Mapping[Any, list[dict[str, Any]]],
           resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """``rows`` minus ``ref`` on the same tasks (seed -> per-task results, over ``rows``' seeds): paired bootstrap CIs
    of the success and reward differences and two-sided exact sign tests on the tasks where they differ. A seed whose
    two lists do not hold the same task ids in the same order is a ValueError, never a misaligned pair."""
    for s in rows:
        if [t["task_id"] for t in rows[s]] != [t["task_id"] for t in ref[s]]:
            name = s if isinstance(s, str) else f"seed {s}"
            raise ValueError(f"{name}: the two sides played different tasks ({len(rows[s])} vs {len(ref[s])} "
                             "episodes): they cannot be paired")

    def column(per_task: Mapping[Any, list[dict[str, Any]]], key: str) -> list[list[float]]:
        return [[float(t[key]) for t in per_task[s]] for s in rows]

    out: dict[str, Any] = {}
    for key, prefix in (("success", ""), ("reward", "reward_")):
        a, b = column(rows, key), column(ref, key)
        sign = sign_test([x for xs in a for x in xs], [x for xs in b for x in xs])
        out |= {f"{prefix}diff": paired_bootstrap_ci(a, b, resamples, seed), f"{prefix}sign_test_p": sign["p"]}
        if key == "success":
            out |= {"better": sign["a_better"], "worse": sign["b_better"]}
    return out


def _ci(x: dict[str, float]) -> str:
    return f"{x['mean']:.3f} [{x['ci_low']:.3f}, {x['ci_high']:.3f}]"


def _diff(x: dict[str, float]) -> str:
    return f"{x['mean']:+.3f} [{x['ci_low']:+.3f}, {x['ci_high']:+.3f}]"


COLUMNS = ("method", "real transitions (RL)", "synthetic transitions", "success [95% CI]", "mean reward [95% CI]",
           "success - SFT [95% CI]", "sign test p", "seconds")


def table_cells(r: dict[str, Any]) -> list[str]:
    vs = r["vs_sft"]
    return [r["method"], f"{r['real_transitions']['mean']:.0f}", f"{r['synthetic_transitions']['mean']:.0f}",
            _ci(r["success_rate"]), _ci(r["mean_reward"]), _diff(vs["diff"]) if vs else "—",
            f"{vs['sign_test_p']:.3g}" if vs else "—", f"{r['seconds']['mean']:.0f}"]


def write_markdown(path: Path, bench: dict[str, Any]) -> None:
    seeds = ", ".join(str(s) for s in bench["seeds"])
    lines = [f"# dreamgym bench: {bench['env']} ({bench['profile']} profile), seeds {seeds}", "",
             f"`{bench['command']}`", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(table_cells(r)) + " |" for r in bench["rows"]]
    lines += ["", f"Means over {len(bench['seeds'])} seeds x {bench['episodes_per_seed']} test episodes each; 95% CIs by "
              f"a bootstrap over seeds, then tasks within each seed ({bench['resamples']} resamples, seed "
              f"{bench['bootstrap_seed']}). `success - SFT`: paired on the same tasks (same seed, same seeded task "
              "order); sign test: two-sided exact binomial on the tasks where exactly one of the two succeeded. "
              "Real transitions: those RL consumed (offline data apart); transitions and seconds are means over seeds."]
    if detail := bench.get("seeds_detail"):
        lines += ["", "Each seed's demo, all stages: " + ", ".join(
            f"{k} {v['total_seconds'] / 60:.1f} min" for k, v in detail.items()) + "."]
    base = bench.get("baseline")
    if base:
        lines += ["", f"Trivial baseline (a random policy on the same test tasks): success {_ci(base['success_rate'])}, "
                  f"mean reward {_ci(base['mean_reward'])}."]
    if ablations := [r for r in bench["rows"] if r.get("vs_dreamgym")]:
        lines += ["", "Ablations against DreamGym on the same tasks (the row minus DreamGym: a negative difference "
                  "means the component helps):", "", "| " + " | ".join(ABLATION_COLUMNS) + " |",
                  "|" + "---|" * len(ABLATION_COLUMNS)]
        lines += ["| " + " | ".join(ablation_cells(r)) + " |" for r in ablations]
    path.write_text("\n".join(lines) + "\n")


def ablation_cells(r: dict[str, Any]) -> list[str]:
    vs = r["vs_dreamgym"]
    return [r["method"], _diff(vs["diff"]), f"{vs['better']} / {vs['worse']}", f"{vs['sign_test_p']:.3g}",
            _diff(vs["reward_diff"])]


def print_bench(bench: dict[str, Any]) -> None:
    t = Table(title=f"dreamgym bench on {bench['env']} ({bench['profile']}), seeds "
                    f"{','.join(map(str, bench['seeds']))}; 95% CIs over seeds x tasks")
    for col in COLUMNS:
        t.add_column(col, justify="left" if col == "method" else "right")
    for r in bench["rows"]:
        t.add_row(*table_cells(r))
    Console().print(t)
    if base := bench.get("baseline"):
        Console().print(f"trivial baseline (random policy, same tasks): success {_ci(base['success_rate'])}, "
                        f"mean reward {_ci(base['mean_reward'])}")
    if ablations := [r for r in bench["rows"] if r.get("vs_dreamgym")]:
        a = Table(title="ablations: the row minus DreamGym on the same tasks (negative: the component helps)")
        for col in ABLATION_COLUMNS:
            a.add_column(col, justify="left" if col == "ablation" else "right")
        for r in ablations:
            a.add_row(*ablation_cells(r))
        Console().print(a)


def run_bench(env: str, seeds: Sequence[int], rows: Sequence[str], profile: str, out: Path,
              overrides: dict[str, Any] | None = None, config: Path | None = None, force: bool = False,
              command: str = "") -> dict[str, Any]:
    """Run (or resume) the demo per seed into ``OUT/seed<k>``, then write ``OUT/bench.json`` and ``OUT/bench.md``."""
    rows = parse_rows(rows)
    cfgs = bench_configs(env, seeds, rows, profile, overrides, config)
    runs: dict[int, Path] = {}
    for cfg in cfgs:
        runs[cfg.seed] = out / f"seed{cfg.seed}"
        run_demo(cfg, runs[cfg.seed], force=force)
    baselines = [b for cfg in cfgs if (b := random_baseline(cfg, runs[cfg.seed])) is not None]
    bench: dict[str, Any] = {
        "command": command, "env": env, "profile": profile, "seeds": list(seeds),
        "episodes_per_seed": cfgs[0].eval_episodes, "resamples": RESAMPLES, "bootstrap_seed": SEED,
        "rows": summarize_bench(runs, rows),
        "baseline": None,
        "seeds_detail": {f"seed{s}": seed_facts(run) for s, run in runs.items()},
    }
    if len(baselines) == len(cfgs):
        bench["baseline"] = {
            "policy": "random",
            "success_rate": bootstrap_ci([[float(t["success"]) for t in b["per_task"]] for b in baselines]),
            "mean_reward": bootstrap_ci([[float(t["reward"]) for t in b["per_task"]] for b in baselines]),
            "per_task": {f"seed{cfg.seed}": b["per_task"] for cfg, b in zip(cfgs, baselines, strict=True)},
        }
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "bench.json.partial"
    tmp.write_text(json.dumps(bench, indent=1))
    os.replace(tmp, out / "bench.json")
    write_markdown(out / "bench.md", bench)
    print_bench(bench)
    Console().print(f"report: {write_bench_report(out)}")  # OUT/report.html: the table, CIs, per-seed curves
    return bench


__all__ = ["DEFAULT_SEEDS", "ROWS", "bench_configs", "parse_seeds", "run_bench", "summarize_bench"]
