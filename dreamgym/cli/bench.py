"""CLI: ``dreamgym bench``, the demo over several seeds with CIs and paired tests vs SFT (:mod:`dreamgym.bench`)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer


def bench(
    env: str = typer.Option("shop", "--env", help="registered env name"),
    seeds: str = typer.Option("0,1,2", help="comma-separated seeds; the demo runs once per seed into OUT/seed<k>"),
    rows: str = typer.Option("sft,grpo_real,dreamgym,s2r", help="comma-separated rows: sft, grpo_real, ppo_real, "
                             "dreamgym, dreamgym_ppo, s2r, and the ablations no_replay, no_reasoning, "
                             "no_task_generator"),
    profile: str = typer.Option("default", help="size profile: default | micro"),
    out: Path = typer.Option(Path("runs/bench"), help="bench directory (OUT/seed<k>/ per seed, OUT/bench.json, "
                                                      "OUT/bench.md)"),
    config: Path | None = typer.Option(None, "--config", exists=True, dir_okay=False,
                                       help="YAML of DemoConfig fields, applied over the profile"),
    set_: list[str] = typer.Option(None, "--set", help="override a DemoConfig field: key=value (repeat)"),
    force: bool = typer.Option(False, "--force", help="redo the stages made under another config (and their "
                                                      "dependents) instead of refusing"),
) -> None:
    """The demo's table over seeds: per-task results, mean ± 95% CI, paired bootstrap and sign test vs SFT."""
    from dreamgym.bench import parse_seeds, run_bench
    from dreamgym.cli.train import parse_overrides
    from dreamgym.pipeline import parse_rows

    seed_list, row_list = parse_seeds(seeds), parse_rows(rows)
    command = shlex.join(["dreamgym", *sys.argv[1:]])
    run_bench(env, seed_list, row_list, profile, out, parse_overrides(set_), config, force=force, command=command)


def bench_merge(
    files: list[Path] = typer.Argument(..., help="bench.json files of one config, on disjoint seeds"),
    out: Path = typer.Option(..., "--out", help="directory for the merged bench.json, bench.md and report.html"),
    rows: str | None = typer.Option(None, help="comma-separated rows (default: those every file has)"),
) -> None:
    """One table from benches run apart on disjoint seeds of the same config (each seed's demo takes hours on 2 cores):
    the CIs and paired tests are recomputed over all the seeds from the files' raw per-task results."""
    import json

    from dreamgym.bench import merge_benches, write_bench

    benches = {}
    for f in files:
        if str(f) in benches:
            raise ValueError(f"{f} is given twice")
        try:
            benches[str(f)] = json.loads(f.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{f}: not JSON ({e.msg} at line {e.lineno})") from None
    merged = merge_benches(benches, rows.split(",") if rows else None,
                           command=shlex.join(["dreamgym", *sys.argv[1:]]))
    write_bench(out, merged)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
    app.command("bench-merge")(bench_merge)
