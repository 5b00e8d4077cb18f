#!/usr/bin/env bash
# Bad input across the CLI: every case must exit 2 with one `error:` line, no traceback, and leave no output.
#   bash benchmarks/bad_inputs.sh            (uses .venv/bin/dreamgym, else `dreamgym` on PATH)
set -u
D=$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/dreamgym
[ -x "$D" ] || D=dreamgym
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; cd "$W" || exit 1
mkdir adir; printf 'iterations: [1\n' > bad.yaml; printf 'a: caf\xe9\n' > latin.yaml; echo "- 1" > list.yaml
printf '\xff\xfe\n' > latin.jsonl; printf '{"task": 3}\n{"traj' > torn.jsonl
n=0; tb=0; bad=0
try() {
  n=$((n+1)); out=$(timeout 120 "$D" "$@" 2>&1); rc=$?
  if echo "$out" | grep -q Traceback; then tb=$((tb+1)); echo "traceback: $*"; fi
  if [ $rc -ne 2 ] || [ "$(echo "$out" | grep -c '^error:')" -ne 1 ]; then bad=$((bad+1)); echo "rc=$rc: $*: $(echo "$out" | tail -1)"; fi
}
try collect --episodes 1 --out adir --env-arg num_products=50
try annotate --annotator rule --data adir --out x.jsonl
try annotate --annotator rule --data latin.jsonl --out x.jsonl
try annotate --annotator rule --data torn.jsonl --out x.jsonl
try buffer build --data adir --out b
try buffer build --data latin.jsonl --out b
try train-exp --data adir --out m
try train-exp --data latin.jsonl --out m
try train-exp --data torn.jsonl --out m --config bad.yaml
try train-exp --data torn.jsonl --out m --config latin.yaml
try train-exp --data torn.jsonl --out m --config list.yaml
try baseline sft --data adir --out s
try baseline sft --data latin.jsonl --out s
try train --config bad.yaml --out r
try train --config latin.yaml --out r
try train --config adir --out r
try train --config list.yaml --out r
try train --env shop --out r --set iterations=abc
try train --env shop --out r --set 'lr=[1'
try demo --out d --config bad.yaml
try demo --out d --set dream_iterations=many
try eval --env shop --policy adir --episodes 1 --env-arg num_products=50
try eval-exp --model adir --data torn.jsonl
try model info adir
try model probe adir
left=$(ls | grep -v -x -E 'adir|bad.yaml|latin.yaml|list.yaml|latin.jsonl|torn.jsonl' | tr '\n' ' ')
echo "inputs $n, tracebacks $tb, not a one-line exit 2: $bad, output left behind: ${left:-none}"
[ $tb -eq 0 ] && [ $bad -eq 0 ] && [ -z "$left" ]
