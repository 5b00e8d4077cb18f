"""CLI: ``dreamgym report RUN_DIR`` writes ``RUN_DIR/report.html`` (dreamgym.report)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

console = Console(stderr=True)


def report_cmd(run_dir: Path = typer.Argument(..., help="a `dreamgym demo --out` run dir or a `dreamgym bench "
                                              "--out` dir")) -> None:
    """Write a self-contained RUN_DIR/report.html: the table, fidelity beside its baselines, curves, samples (for a
    bench dir: the table with CIs over seeds, paired differences from SFT, each seed's curves and fidelity)."""
    from dreamgym.report import write_bench_report, write_report

    path = write_bench_report(run_dir) if (run_dir / "bench.json").exists() else write_report(run_dir)
    console.print(f"wrote {path}")
    print(path)


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
