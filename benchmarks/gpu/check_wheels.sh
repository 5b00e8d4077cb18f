#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.py needs beyond benchmarks/gpu/wheels.sh's (pydantic, gymnasium): what its
# run imports on the CPU here that a torch + transformers + accelerate + peft image may lack (tensorboard for
# the RL trainer's SummaryWriter, the replay index's faiss and bm25s, datasets for the SFT data). Run here,
# where PyPI is reachable, for the device's Python 3.12, into .whl/ (git-ignored); name .whl in the device run's
# `carry` and `pip install --no-deps .whl/*.whl` there before the check. NOT RUN against the GPU image yet (no
# device was drawn when it was written): a package the image lacks that is not listed here is an ImportError
# in the check's first lines; add it to EXTRA. Versions: those this checkout's .venv has.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PIP=${PIP:-.venv/bin/pip}
bash benchmarks/gpu/wheels.sh
version() { "$PIP" show "$1" 2>/dev/null | awk '/^Version:/ {print $2}'; }
EXTRA=${EXTRA:-"tensorboard tensorboard-data-server absl-py protobuf markdown werkzeug faiss-cpu bm25s cloudpickle"}
for name in $EXTRA; do
  v=$(version "$name")
  [ -n "$v" ] || { echo "check_wheels.sh: $name is not installed in $PIP's environment" >&2; exit 2; }
  "$PIP" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl "$name==$v"
done
du -sh .whl
