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
    """A seed's stage seconds (each stage's marker; their sum is the demo's length), M_exp's held-out fidelity
    (``table.json``) and the software each stage was made with (:func:`dreamgym.software.software`; stages made
    before markers recorded it are left out), so that bench.json says how long a seed took, how faithful its dream
    was and what made it."""
    markers = {p.stem: json.loads(p.read_text()) for p in sorted((run / "stages").glob("*.json"))
               if not p.name.endswith(".started.json")}
    seconds = {name: m.get("stage_seconds") for name, m in markers.items()}
    table = json.loads((run / "table.json").read_text()) if (run / "table.json").exists() else {}
    return {"stage_seconds": seconds, "total_seconds": round(sum(v for v in seconds.values() if v), 1),
            "fidelity": table.get("fidelity"),
            "software": {name: m["software"] for name, m in markers.items() if m.get("software")}}


def _series(values: list[float]) -> dict[str, Any]:
    return {"per_seed": values, "mean": sum(values) / len(values)}


SEED_COUNTS = ("real_transitions", "synthetic_transitions", "seconds")  # a row's per-seed numbers besides its tasks


def run_rows(run: Path, rows: Sequence[str]) -> dict[str, dict[str, Any]]:
    """One seed's rows as its run dir holds them (row -> method, real and synthetic transitions, seconds and the
    per-task results); SFT's is always read: every row is paired with it."""
    out: dict[str, dict[str, Any]] = {}
    for row in dict.fromkeys(["sft", *rows]):
        marker = json.loads((run / "stages" / f"{row}.json").read_text())
        out[row] = {"method": marker["method"], "real_transitions": int(marker["real_transitions"]),
                    "synthetic_transitions": int(marker.get("synthetic_transitions") or 0),
                    "seconds": float(marker["stage_seconds"]), "per_task": _per_task(run, row)}
    return out


def summarize_bench(runs: dict[int, Path], rows: Sequence[str], resamples: int = RESAMPLES,
                    seed: int = SEED) -> list[dict[str, Any]]:
    """Each row's numbers over the seeds' run dirs (``runs``: seed -> RUN); the rows of a seed must have played the
    same tasks in the same order (a ValueError otherwise)."""
    return summarize_rows({s: run_rows(run, rows) for s, run in runs.items()}, rows, resamples, seed)


def summarize_rows(seeds: Mapping[int, Mapping[str, Mapping[str, Any]]], rows: Sequence[str],
                   resamples: int = RESAMPLES, seed: int = SEED) -> list[dict[str, Any]]:
    """Each row's numbers over the seeds (seed -> :func:`run_rows`): mean and 95% CI (bootstrap over seeds, then
    tasks), the paired comparison with SFT and, for an ablation, with DreamGym."""
    tasks = {s: seeds[s]["sft"]["per_task"] for s in seeds}
    full = {s: seeds[s]["dreamgym"]["per_task"] for s in seeds} if "dreamgym" in rows else None
    out = []
    for row in rows:
        per_task = {s: seeds[s][row]["per_task"] for s in seeds}
        success = [[float(t["success"]) for t in per_task[s]] for s in seeds]
        reward = [[float(t["reward"]) for t in per_task[s]] for s in seeds]
        entry: dict[str, Any] = {
            "row": row, "method": seeds[next(iter(seeds))][row]["method"],
            **{key: _series([seeds[s][row][key] for s in seeds]) for key in SEED_COUNTS},
            "success_rate": bootstrap_ci(success, resamples, seed),
            "mean_reward": bootstrap_ci(reward, resamples, seed),
            "vs_sft": None,
            "per_task": {f"seed{s}": per_task[s] for s in seeds},
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
        "config": config_record(cfgs[0]),
        "rows": summarize_bench(runs, rows),
        "baseline": None,
        "seeds_detail": {f"seed{s}": seed_facts(run) for s, run in runs.items()},
    }
    if len(baselines) == len(cfgs):
        bench["baseline"] = baseline_entry({cfg.seed: b["per_task"] for cfg, b in zip(cfgs, baselines, strict=True)})
    write_bench(out, bench)
    return bench


def write_bench(out: Path, bench: dict[str, Any]) -> None:
    """``OUT/bench.json`` (atomic), ``OUT/bench.md``, the rich table and ``OUT/report.html``."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "bench.json.partial"
    tmp.write_text(json.dumps(bench, indent=1))
    os.replace(tmp, out / "bench.json")
    write_markdown(out / "bench.md", bench)
    print_bench(bench)
    Console().print(f"report: {write_bench_report(out)}")  # OUT/report.html: the table, CIs, per-seed curves


def baseline_entry(per_task: Mapping[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """The random policy's success and mean reward over the seeds (seed -> its per-task results)."""
    return {"policy": "random",
            "success_rate": bootstrap_ci([[float(t["success"]) for t in ts] for ts in per_task.values()]),
            "mean_reward": bootstrap_ci([[float(t["reward"]) for t in ts] for ts in per_task.values()]),
            "per_task": {f"seed{s}": ts for s, ts in per_task.items()}}


def config_record(cfg: DemoConfig) -> dict[str, Any]:
    """What bench.json records of the config: the seed's DemoConfig without its seed and rows (a row's stages are
    the same whichever other rows ran), so that benches run apart merge only where they ran the same config."""
    return cfg.model_dump(mode="json", exclude={"seed", "rows"})


def _difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first field where two JSON values differ, as ``path: a vs b``; None where they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path}{key}: {'missing' if key not in a else 'set'} vs {'missing' if key not in b else 'set'}"
            if (found := _difference(a[key], b[key], f"{path}{key}.")) is not None:
                return found
        return None
    return None if a == b else f"{path.rstrip('.') or 'value'}: {json.dumps(a)} vs {json.dumps(b)}"


def _current(name: str, record: Any) -> dict[str, Any]:
    """A recorded config as today's DemoConfig reads it: a field added since it was written takes its default,
    which is the behaviour the config ran with (a new field's default keeps the old behaviour)."""
    try:
        return config_record(DemoConfig.model_validate({**record, "seed": 0}))
    except (TypeError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        raise ValueError(f"{name}: its config does not validate today ({str(e).splitlines()[0]})") from None


MERGE_FIELDS = ("env", "profile", "seeds", "episodes_per_seed", "rows", "config")


def merge_benches(benches: Mapping[str, Mapping[str, Any]], rows: Sequence[str] | None = None,
                  command: str = "") -> dict[str, Any]:
    """One bench from benches run apart (name -> its bench.json) on disjoint seeds: a seed's demo is hours on 2 cores,
    so the seeds of one table may come from several machines or sessions. They must share the env, profile, test
    episodes per seed and config (:func:`config_record`); the statistics are recomputed over all the seeds from the
    raw per-task results, as one bench over those seeds computes them. ``rows``: by default those every bench ran.
    Any mismatch is a one-line ValueError naming the file and the field."""
    if len(benches) < 2:
        raise ValueError("bench-merge needs two or more bench.json files")
    items = list(benches.items())
    for name, b in items:
        if not isinstance(b, Mapping) or (missing := [k for k in MERGE_FIELDS if k not in b]):
            raise ValueError(f"{name}: not a bench.json" if not isinstance(b, Mapping) else
                             f"{name}: no {missing[0]!r} in it" + (" (written before bench.json recorded its config; "
                                                                 "rerun its seeds to merge them)"
                                                                 if missing[0] == "config" else ""))
        if not isinstance(b["rows"], list) or not all(isinstance(r, Mapping) and "row" in r for r in b["rows"]):
            raise ValueError(f"{name}: not a bench.json (its rows are not a list of named rows)")
        if not isinstance(b["seeds"], list) or not all(isinstance(x, int) for x in b["seeds"]):
            raise ValueError(f"{name}: not a bench.json (its seeds are not a list of integers)")
    (first_name, first), origin = items[0], dict[int, str]()
    config = _current(first_name, first["config"])
    for name, b in items:
        for key in ("env", "profile", "episodes_per_seed"):
            if b[key] != first[key]:
                raise ValueError(f"{name} and {first_name} differ in {key}: {b[key]!r} vs {first[key]!r}")
        if (diff := _difference(_current(name, b["config"]), config)) is not None:
            raise ValueError(f"{name} and {first_name} ran other configs: {diff}")
        for s in b["seeds"]:
            if s in origin:
                raise ValueError(f"seed {s} is in both {origin[s]} and {name}")
            origin[s] = name
    ran = [{r["row"] for r in b["rows"]} for _, b in items]
    common = [r["row"] for r in first["rows"] if all(r["row"] in x for x in ran)]
    rows = parse_rows(rows) if rows else tuple(common)
    for row in dict.fromkeys(["sft", *rows]):
        if row not in common:
            raise ValueError(f"row {row!r} is not in every bench (rows in all: {', '.join(common) or 'none'})")
    seeds: dict[int, dict[str, dict[str, Any]]] = {}
    baseline: dict[int, list[dict[str, Any]]] | None = {}
    for name, b in items:
        by_row = {r["row"]: r for r in b["rows"]}
        try:
            for i, s in enumerate(b["seeds"]):
                seeds[s] = {row: {"method": by_row[row]["method"],
                                  **{k: by_row[row][k]["per_seed"][i] for k in SEED_COUNTS},
                                  "per_task": list(by_row[row]["per_task"][f"seed{s}"])}
                            for row in dict.fromkeys(["sft", *rows])}
                if baseline is not None and b.get("baseline"):
                    baseline[s] = list(b["baseline"]["per_task"][f"seed{s}"])
                else:
                    baseline = None
        except (KeyError, IndexError, TypeError) as e:
            raise ValueError(f"{name}: not a complete bench.json ({type(e).__name__}: {e})") from None
    order = sorted(seeds)
    bench: dict[str, Any] = {
        "command": command, "env": first["env"], "profile": first["profile"], "seeds": order,
        "episodes_per_seed": first["episodes_per_seed"], "resamples": RESAMPLES, "bootstrap_seed": SEED,
        "config": first["config"], "merged_from": {name: list(b["seeds"]) for name, b in items},
        "rows": summarize_rows({s: seeds[s] for s in order}, rows),
        "baseline": baseline_entry({s: baseline[s] for s in order}) if baseline else None,
        "seeds_detail": {f"seed{s}": (benches[origin[s]].get("seeds_detail") or {}).get(f"seed{s}") for s in order},
    }
    return bench


__all__ = ["DEFAULT_SEEDS", "ROWS", "bench_configs", "merge_benches", "parse_seeds", "run_bench", "summarize_bench"]
