#!/usr/bin/env bash
# Issue 12's GPU step, sized for one device session (15 min of GPU time, one command of at most 10 min): pre-train
# one base or several (one process each, run together), each with the copy and match warm-ups on the GPU, and bring
# back each base as $OUT/NAME.tar (its files, manifest, warm-up records) with $OUT/NAME.log. Run it through the
# device tool:
#   bash benchmarks/gpu/wheels.sh            # here, once: .whl/ with the wheels the image lacks
#   run(command="bash benchmarks/gpu/pretrain_base.sh", carry=[".whl"], timeout_s=590)
# Each variant is "NAME PRESET CORPUS COPY_STEPS MATCH_STEPS TOKENS"; CAP (seconds) is every process's safety limit
# (its warm-ups and mixture stop there; the manifest says whether it fired). The manifest holds the copy probe and
# the answer probe; downstream checks run on the CPU (README, "A base warmed up on a GPU").
# Locally, `VARIANTS="t 64x2 5 3 3 20000" CAP=60 bash benchmarks/gpu/pretrain_base.sh` checks the script.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
# Measured on the H200 (2026-12-04, three processes at once: README, "A base warmed up on a GPU"): a warm-up step
# of a 128x4 took ~45-50 ms (three processes on one GPU, each making its batches on the CPU),
# and 24M corpus tokens took 110-120 s to prepare; the warm-ups then used the whole cap and the mixture ran 1 step.
# So the default is one process on recipe 6 (recipe 5 plus finished pages answered by buying), with the warm-ups
# and the mixture sized to fit the cap together even at ~50 ms a step. Not run on a GPU yet; the same command ran on the
# 2 CPU cores in 48 min (--time-cap 5400; README, "The GPU script's base, made on the CPU").
CAP=${CAP:-480}
VARIANTS=${VARIANTS:-"g6 128x4 6 1200 4000 12000000"}
OUT=${OUT:-/tmp/dreamgym-gpu-out}
PY=${PY:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$OUT/device.txt"
pids=()
while read -r name preset corpus copy match tokens; do
  [ -n "$name" ] || continue
  ( "$PY" -m dreamgym model pretrain --out "/tmp/bases/$name" --preset "$preset" --corpus-version "$corpus" \
      --copy-steps "$copy" --match-steps "$match" --tokens "$tokens" --seed 0 --group-by-length --threads 4 \
      --time-cap "$CAP" > "/tmp/$name.full.log" 2>&1
    echo "exit $?" >> "/tmp/$name.full.log"
    grep -v "it/s\]\|s/it\]\|step/s\]" "/tmp/$name.full.log" | tail -n 40 > "$OUT/$name.log"
    tar -C /tmp/bases --exclude checkpoints -cf "$OUT/$name.tar" "$name" ) &
  pids+=($!)
done <<< "$VARIANTS"
wait "${pids[@]}"
for f in "$OUT"/*.log; do echo "== $f"; tail -n 4 "$f"; done
