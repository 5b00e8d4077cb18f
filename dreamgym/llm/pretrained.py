"""The shipped pre-trained bases: ``pretrained`` or ``pretrained-policy`` wherever a model is chosen resolves to a
checked directory.

- ``dreamgym/assets/pretrained/`` (``pretrained``), corpus recipe 1: the experience model's base, and the demo's.
- ``dreamgym/assets/pretrained-policy/`` (``pretrained-policy``), corpus recipe 6 with the copy and match warm-ups:
  the policy's base, whose cloned shop policy picks the task's options (README, "The policy's base"). Its weights
  are stored at half precision (:func:`pack_base`) so that both bases fit the package's 10 MB; its config says
  float32, so transformers loads it as float32, the precision it was trained and measured in.

Each is a tiny Llama (config, safetensors, byte-level BPE tokenizer with a chat template) made by
``dreamgym model pretrain`` with a ``MANIFEST.json`` holding the exact command, the corpus version, the tokens seen,
the machine and the sha256 of every file. Every use checks the files against the manifest, so a truncated or
edited file is a one-line error naming the file and the command that rebuilds it, never a model that silently
differs from the one measured in the README.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

PRETRAINED = "pretrained"
PRETRAINED_POLICY = "pretrained-policy"
BASES = (PRETRAINED, PRETRAINED_POLICY)
ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "pretrained"
MANIFEST = "MANIFEST.json"
REBUILD = ("rebuild it with the command in its MANIFEST.json (dreamgym model pretrain --out DIR ..., then "
           "packed.command where it has one)")
# What a packed base keeps of its source: the files transformers loads it from (no training checkpoints or logs)
INFERENCE_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                   "tokenizer_config.json", "chat_template.jinja")


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


def base_dir(name: str) -> Path:
    """The asset directory of a shipped base (one of :data:`BASES`)."""
    if name not in BASES:
        raise ValueError(f"{name!r}: not a shipped base (one of {', '.join(BASES)})")
    return ASSET_DIR if name == PRETRAINED else ASSET_DIR.parent / name


def resolve_model(name: str) -> str:
    """A shipped base's name (:data:`BASES`) -> its checked directory; any other name is returned unchanged."""
    if name not in BASES:
        return name
    path = base_dir(name)
    read_manifest(path)
    return str(path)


def copy_base(out: str | os.PathLike[str], name: str = PRETRAINED) -> dict[str, Any]:
    """Copy a checked shipped base (its files and manifest) into ``out`` (empty or absent); return its manifest."""
    dest = Path(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{dest}: output directory is not empty")
    src = base_dir(name)
    manifest = read_manifest(src)
    dest.mkdir(parents=True, exist_ok=True)
    for file in [*manifest["files"], MANIFEST]:
        shutil.copy2(src / file, dest / file)
    return manifest


def pack_base(src: str | os.PathLike[str], out: str | os.PathLike[str], dtype: str = "float16",
              command: str | None = None) -> dict[str, Any]:
    """Copy a checked base's inference files into ``out`` (empty or absent) with its weights stored as ``dtype``
    and a manifest: the source's, the new sha256 of every file, and ``packed`` (the source's model sha256, the
    dtype, the largest rounding error relative to a tensor's largest weight, and ``command``).

    The config keeps ``dtype: float32``, so transformers loads the packed weights as float32 (the precision the
    base was trained and measured in); only storage halves. Half precision, not bfloat16: the tiny base's
    weights lie well inside float16's range (checked: an overflow is an error), where it keeps 3 more bits.
    """
    import torch
    from safetensors.torch import load_file, save_file

    if dtype not in ("float16", "bfloat16"):
        raise ValueError(f"--dtype {dtype!r}: not float16 or bfloat16")
    source, dest = Path(resolve_model(str(src))), Path(out)
    manifest = read_manifest(source)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{dest}: output directory is not empty")
    weights = load_file(str(source / "model.safetensors"))
    packed = {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v for k, v in weights.items()}
    if any(not torch.isfinite(v).all() for v in packed.values() if v.is_floating_point()):
        raise ValueError(f"{source / 'model.safetensors'}: a weight overflows {dtype}; pack it as bfloat16")
    error = max(((packed[k].float() - v).abs().max() / v.abs().max().clamp_min(1e-12)).item()
                for k, v in weights.items() if v.is_floating_point())
    dest.mkdir(parents=True, exist_ok=True)
    save_file(packed, str(dest / "model.safetensors"), metadata={"format": "pt"})
    names = [n for n in INFERENCE_FILES if n != "model.safetensors" and (source / n).is_file()]
    for name in names:
        shutil.copy2(source / name, dest / name)
    out_manifest = {**manifest, "files": {n: sha256(dest / n) for n in ["model.safetensors", *names]},
                    "packed": {"from": str(source), "from_model_sha256": manifest["files"].get("model.safetensors"),
                               "dtype": dtype, "max_relative_error": error, "command": command}}
    (dest / MANIFEST).write_text(json.dumps(out_manifest, indent=2) + "\n", encoding="utf-8")
    return out_manifest


def base_info(name: str = PRETRAINED) -> dict[str, Any]:
    """``{path, params, bytes, sha256, tokens_seen}`` of a base (a shipped one's name or a directory), checked."""
    path = base_dir(name) if name in BASES else Path(name)
    manifest = read_manifest(path)
    files = manifest["files"]
    return {
        "path": str(path),
        "params": manifest.get("params"),
        "bytes": sum((path / n).stat().st_size for n in files),
        "sha256": files,
        "tokens_seen": manifest.get("tokens_seen"),
    }
