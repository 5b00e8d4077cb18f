"""CLI: ``dreamgym demo``, the main job on any registered env (the shop by default; see :mod:`dreamgym.pipeline`)."""

from __future__ import annotations

from pathlib import Path

import typer


def demo(
    out: Path = typer.Option(Path("runs/demo"), help="run directory (every stage is cached here)"),
    profile: str = typer.Option("default", help="size profile: default | micro (a few minutes, the CI test)"),
    config: Path | None = typer.Option(None, "--config", exists=True, dir_okay=False,
                                       help="YAML of DemoConfig fields, applied over the profile (e.g. "
                                            "configs/textworld-tiny.yaml)"),
    set_: list[str] = typer.Option(None, "--set", help="override a DemoConfig field: key=value (repeat)"),
    force: bool = typer.Option(False, "--force", help="redo the stages in --out made under another config and "
                                                      "those that depend on them (without it: an error naming the field)"),
) -> None:
    """Collect → annotate → train M_exp → SFT → GRPO-real → DreamGym → S2R on an env; print Table 1."""
    from dreamgym.cli.train import parse_overrides
    from dreamgym.pipeline import demo_config, run_demo

    run_demo(demo_config(profile, parse_overrides(set_), config), out, force=force)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
