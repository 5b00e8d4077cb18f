"""Small durable-file helpers: full writes, fsync of a directory, atomic replacement of a file."""

from __future__ import annotations

import os
from pathlib import Path


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a single call may write fewer)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_path(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def replace_durably(tmp: Path, path: Path) -> None:
    """fsync ``tmp``, then ``os.replace`` it over ``path``: a reader sees the old file or the new one, never half."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = tmp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)
    replace_durably(tmp, path)
