"""CLI: ``dreamgym demo``, the main job on the embedded default (see :mod:`dreamgym.pipeline`)."""

from __future__ import annotations

from pathlib import Path

import typer


def demo(
    out: Path = typer.Option(Path("runs/demo"), help="run directory (every stage is cached here)"),
    profile: str = typer.Option("default", help="size profile: default | micro (a few minutes, the CI test)"),
    set_: list[str] = typer.Option(None, "--set", help="override a DemoConfig field: key=value (repeat)"),
) -> None:
    """Collect → annotate → train M_exp → SFT → GRPO-real → DreamGym → S2R on the shop; print Table 1."""
    from dreamgym.cli.train import parse_overrides
    from dreamgym.pipeline import demo_config, run_demo

    run_demo(demo_config(profile, parse_overrides(set_)), out)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
