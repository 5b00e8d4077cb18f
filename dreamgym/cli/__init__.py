"""The ``dreamgym`` command. Each concern adds its commands from its own module (``register(app)``).

Errors that users cause (bad files, bad configs, bad arguments) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import logging
import os
import sys

import typer
from rich.console import Console

from dreamgym.cli import baseline as _baseline
from dreamgym.cli import bench as _bench
from dreamgym.cli import buffer as _buffer
from dreamgym.cli import data as _data
from dreamgym.cli import demo as _demo
from dreamgym.cli import env as _env
from dreamgym.cli import experience as _experience
from dreamgym.cli import model as _model
from dreamgym.cli import report as _report
from dreamgym.cli import train as _train

app = typer.Typer(
    name="dreamgym",
    help="Train LLM agents with RL on synthesised experience (DreamGym).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err = Console(stderr=True)

for _mod in (_data, _demo, _bench, _env, _model, _buffer, _train, _experience, _baseline, _report):
    _mod.register(app)


@app.callback()
def _root(
    import_: list[str] = typer.Option(
        [], "--import", metavar="MODULE",
        help="import a module or .py file that registers envs (dreamgym.envs.register) before the command; "
             "repeatable, and accepted after any command too. Installed packages can use the 'dreamgym.envs' "
             "entry-point group instead.",
    ),
) -> None:
    """Train LLM agents with RL on synthesised experience (DreamGym)."""


def pop_imports(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(modules, rest)``: the ``--import MODULE`` / ``--import=MODULE`` options anywhere before ``--``, and
    the other arguments, so that every command takes them."""
    modules: list[str] = []
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--":
            rest += [arg, *args]
            break
        if arg == "--import":
            value = next(args, None)
            if value is None:
                raise ValueError("--import needs a MODULE (a dotted name or a .py file)")
            modules.append(value)
        elif arg.startswith("--import="):
            modules.append(arg.partition("=")[2])
        else:
            rest.append(arg)
    return modules, rest


def describe(e: BaseException) -> str:
    """One line for a user error: a config's field at fault and why, a path's problem, bad text."""
    from pydantic import ValidationError
    from yaml import YAMLError

    from dreamgym.types import first_error

    if isinstance(e, ValidationError):  # "RLConfig: iterations: Input should be a valid integer"
        return f"{e.title}: {first_error(e)}"
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
    if isinstance(e, YAMLError):  # a --set value (files go through dreamgym.types.read_yaml_mapping)
        return f"invalid YAML ({str(e).splitlines()[0]})"
    if isinstance(e, OSError) and e.filename is not None:  # a directory where a file belongs, permissions
        return f"{e.filename}: {e.strerror or type(e).__name__}"
    text = str(e)
    return text.splitlines()[0] if text else type(e).__name__


def main() -> None:
    from yaml import YAMLError

    from dreamgym.envs import load_plugins
    from dreamgym.llm.base import LLMError
    from dreamgym.types import DataError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # under a multi-process launcher (accelerate launch) every error names its rank; the launcher then ends the run
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = f"rank {os.environ.get('RANK', '?')} of {world}: " if world > 1 else ""
    try:
        modules, argv = pop_imports(sys.argv[1:])
        load_plugins(modules)
        app(args=argv)
    except (DataError, OSError, KeyError, ValueError, LLMError, YAMLError) as e:
        err.print(f"[red]error:[/red] {rank}{describe(e)}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except Exception as e:
        if not rank:
            raise
        from rich.markup import escape

        what = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        if type(e).__name__.startswith("Dist"):  # a collective broke: a peer died (its own line names it)
            what = f"lost the other ranks ({what})"
        err.print(f"[red]error:[/red] {rank}{escape(what)}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
