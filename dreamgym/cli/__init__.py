"""The ``dreamgym`` command. Each concern adds its commands from its own module (``register(app)``).

Errors that users cause (bad files, bad configs, bad arguments) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import logging
import sys

import typer
from rich.console import Console

from dreamgym.cli import baseline as _baseline
from dreamgym.cli import buffer as _buffer
from dreamgym.cli import data as _data
from dreamgym.cli import demo as _demo
from dreamgym.cli import env as _env
from dreamgym.cli import experience as _experience
from dreamgym.cli import model as _model
from dreamgym.cli import train as _train

app = typer.Typer(
    name="dreamgym",
    help="Train LLM agents with RL on synthesised experience (DreamGym).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err = Console(stderr=True)

for _mod in (_data, _demo, _env, _model, _buffer, _train, _experience, _baseline):
    _mod.register(app)


def main() -> None:
    from dreamgym.llm.base import LLMError
    from dreamgym.types import DataError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except (DataError, FileNotFoundError, KeyError, ValueError, ConnectionError, LLMError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        err.print(f"[red]error:[/red] {msg}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
