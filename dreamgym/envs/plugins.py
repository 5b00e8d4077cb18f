"""Envs from outside this repository: the ``dreamgym.envs`` entry-point group and ``--import MODULE``.

A package registers its envs in a module that calls :func:`dreamgym.envs.register`, and names it either in its
own ``pyproject.toml`` (loaded by every dreamgym command, as pytest loads its plugins)::

    [project.entry-points."dreamgym.envs"]
    myenv = "mypkg.envs"

or on the command line, as a module or a file: ``dreamgym --import mypkg.envs demo --set env=myenv``,
``dreamgym --import ./myenv.py eval --env myenv ...``.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "dreamgym.envs"
_loaded_entry_points = False


def load_plugins(modules: Sequence[str] = ()) -> list[str]:
    """Import every ``dreamgym.envs`` entry point (once per process) and then ``modules``; returns what was
    imported. A module that fails to import raises a ``ValueError`` naming it; a broken entry point of another
    installed package is logged and skipped, so it cannot stop every command."""
    global _loaded_entry_points
    imported: list[str] = []
    if not _loaded_entry_points:
        _loaded_entry_points = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
                imported.append(ep.value)
            except Exception as e:  # another package's bug must not break dreamgym: counted in the log
                log.warning("dreamgym.envs entry point %r (%s) failed to load: %s", ep.name, ep.value, e)
    for name in modules:
        try:
            _import(name)
        except Exception as e:  # the user's module: its error in one line, not a traceback
            raise ValueError(f"--import {name}: {type(e).__name__}: {e}") from None
        imported.append(name)
    return imported


def _import(name: str) -> None:
    """A module by dotted name (looked up from the working directory too, as ``python -m`` does) or a
    ``.py`` file by path."""
    path = Path(name)
    if path.suffix == ".py":
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
        return
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    importlib.import_module(name)
