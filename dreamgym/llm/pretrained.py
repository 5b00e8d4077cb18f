"""The shipped pre-trained base: ``pretrained`` wherever a model is chosen resolves to a checked directory.

``dreamgym/assets/pretrained/`` holds a tiny Llama (config, safetensors, byte-level BPE tokenizer with a chat
template) made by ``dreamgym model pretrain`` and a ``MANIFEST.json`` with the exact command, the corpus
version, the tokens seen, the machine and the sha256 of every file. Every use checks the files against the
manifest, so a truncated or edited file is a one-line error naming the file and the command that rebuilds it,
never a model that silently differs from the one measured in the README.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

PRETRAINED = "pretrained"
ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "pretrained"
MANIFEST = "MANIFEST.json"
REBUILD = "rebuild it with the command in its MANIFEST.json (dreamgym model pretrain --out DIR ...)"


class BaseModelError(ValueError):
    """A base directory whose files do not match its manifest (the CLI prints it as one line, exit 2)."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a base directory, after checking every file it lists against its sha256."""
    base = Path(path)
    manifest_file = base / MANIFEST
    if not manifest_file.is_file():
        raise BaseModelError(f"{manifest_file}: missing; {REBUILD}")
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        files = dict(manifest["files"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, UnicodeDecodeError):
        raise BaseModelError(f"{manifest_file}: not a valid manifest; {REBUILD}") from None
    for name, digest in files.items():
        f = base / name
        if not f.is_file():
            raise BaseModelError(f"{f}: missing; {REBUILD}")
        if sha256(f) != digest:
            raise BaseModelError(f"{f}: sha256 does not match {MANIFEST} (corrupt or edited); {REBUILD}")
    return dict(manifest)


def resolve_model(name: str) -> str:
    """``pretrained`` -> the checked shipped base directory; any other name is returned unchanged."""
    if name != PRETRAINED:
        return name
    read_manifest(ASSET_DIR)
    return str(ASSET_DIR)


def copy_base(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Copy the checked shipped base (its files and manifest) into ``out`` (empty or absent); return its manifest."""
    dest = Path(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{dest}: output directory is not empty")
    manifest = read_manifest(ASSET_DIR)
    dest.mkdir(parents=True, exist_ok=True)
    for name in [*manifest["files"], MANIFEST]:
        shutil.copy2(ASSET_DIR / name, dest / name)
    return manifest


def base_info(name: str = PRETRAINED) -> dict[str, Any]:
    """``{path, params, bytes, sha256, tokens_seen}`` of a base (``pretrained`` or a directory), checked."""
    path = Path(ASSET_DIR if name == PRETRAINED else name)
    manifest = read_manifest(path)
    files = manifest["files"]
    return {
        "path": str(path),
        "params": manifest.get("params"),
        "bytes": sum((path / n).stat().st_size for n in files),
        "sha256": files,
        "tokens_seen": manifest.get("tokens_seen"),
    }
