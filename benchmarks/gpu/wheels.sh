#!/usr/bin/env bash
# The wheels the GPU machine's image lacks for `dreamgym model pretrain` / `model probe` (its image has torch,
# transformers, tokenizers, safetensors, typer, rich, pyyaml, numpy; not pydantic or gymnasium), for its
# Python 3.12, into .whl/ (git-ignored). Run here, where PyPI is reachable; then name .whl in the device run's
# `carry` (see benchmarks/gpu/pretrain_base.sh). Versions: those this checkout's .venv has.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PIP=${PIP:-.venv/bin/pip}
version() { "$PIP" show "$1" 2>/dev/null | awk '/^Version:/ {print $2}'; }
mkdir -p .whl
for name in pydantic pydantic_core annotated-types typing-inspection gymnasium farama-notifications; do
  v=$(version "$name")
  [ -n "$v" ] || { echo "wheels.sh: $name is not installed in $PIP's environment (make install first)" >&2; exit 2; }
  "$PIP" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$name==$v"
done
ls -l .whl
