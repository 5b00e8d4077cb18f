"""What software made a result: the library versions that can change a number, and dreamgym's git commit.

The same command, seed and step budgets give the same table only under the same numerics: a new transformers,
tokenizers or torch release may change a training run's floating-point path. Every demo and bench stage records
:func:`software` in its marker (``RUN/stages/<name>.json``), so a result that does not reproduce can be traced to
a library change or to a code change.
"""

from __future__ import annotations

import platform
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "transformers", "tokenizers", "accelerate", "peft", "numpy", "textworld", "scienceworld")


@cache
def software() -> dict[str, str]:
    """Python's and :data:`PACKAGES`' versions (those installed) and ``dreamgym``: its version and, in a git
    checkout, the commit (``+dirty`` when tracked files have uncommitted changes)."""
    found = {"python": platform.python_version()}
    for name in (*PACKAGES, "dreamgym"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    if commit := _git_commit(Path(__file__).resolve().parent.parent):
        found["dreamgym_commit"] = commit
    return found


def _git_commit(root: Path) -> str | None:
    """HEAD's hash, with ``+dirty`` where tracked files differ from it; None outside a git checkout."""
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


__all__ = ["PACKAGES", "software"]
