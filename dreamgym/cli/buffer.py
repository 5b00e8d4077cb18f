"""CLI: ``dreamgym buffer build|query`` (filled in by the replay-buffer issue)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
