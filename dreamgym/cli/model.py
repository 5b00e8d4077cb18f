"""CLI: ``dreamgym model init`` and ``dreamgym serve`` (filled in by the models issue)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
