"""Collects ``benchmarks/results/gpu_base.json`` (README, "A base warmed up on a GPU") from the run directories the
commands in it write: the GPU bases' manifests (``runs/gpu/NAME``, unpacked from the device call's ``NAME.tar``),
the CPU continuations, ``benchmarks/match_finished.py``'s output and ``benchmarks/policy_diag.py``'s, and adds the 95%
Wilson intervals the README quotes (:func:`dreamgym.stats.wilson_interval`).

    python benchmarks/gpu_base_results.py
"""

from __future__ import annotations

import json
from pathlib import Path

from dreamgym.stats import wilson_interval

DEVICE = "torch 2.11.0+cu130 cuda True NVIDIA H200"  # what the device call printed (its device.txt)


def wilson(share: float, n: int) -> list[float]:
    return [round(x, 3) for x in wilson_interval(round(share * n), n)]


out = {
 "what": "Bases warmed up on one H200 (benchmarks/gpu/pretrain_base.sh; three processes at once, CAP 450 s), and the shop policy cloned from them on the CPU (val, 200 tasks, greedy; training seed 0, and seed 1 for g6d), beside the shipped base's.",
 "device_run": {"command": "run(command='bash benchmarks/gpu/pretrain_base.sh', carry=['.whl'], timeout_s=590)",
   "variants_then": "g4 128x4 4 1200 6000 24000000 / g5 128x4 5 1200 6000 24000000 / g5w 160x6 5 1200 6000 24000000 (NAME PRESET CORPUS COPY_STEPS MATCH_STEPS TOKENS), CAP=450",
   "device": DEVICE, "wall_s": 556.2},
 "bases": {}, "continued": {}, "policy_val": {},
}
for n in ("g4", "g5", "g5w"):
    m = json.loads(Path(f"runs/gpu/{n}/MANIFEST.json").read_text())
    out["bases"][n] = {k: m[k] for k in ("command", "preset", "params", "corpus_version", "copy_warmup", "match_warmup",
                                          "steps", "planned_steps", "time_cap_fired", "prep_seconds", "copy_probe", "answer_probe")}
    out["bases"][n]["model_sha256"] = m["files"]["model.safetensors"]
    out["bases"][n]["match_warmup"]["accuracy_wilson95"] = wilson(m["match_warmup"]["accuracy"], 64)
for n, steps in (("g6c", 400), ("g6d", 1500)):
    m = json.loads(Path(f"runs/gpu/{n}/MANIFEST.json").read_text())
    out["continued"][n] = {k: m[k] for k in ("command", "init", "corpus_version", "match_warmup", "steps", "train_seconds", "copy_probe")}
    out["continued"][n]["command"] = f"dreamgym model pretrain --out runs/gpu/{n} --init runs/gpu/g5 --corpus-version 6 --match-steps {steps} --tokens 10000 --seed 0 --threads 2 --group-by-length"
out["match_finished"] = json.loads(Path("runs/gpu/match_finished.json").read_text())
diag = json.loads(Path("runs/cmp/gpu_val_s0.json").read_text())
ship = json.loads(Path("benchmarks/results/compact_prompt.json").read_text())
out["policy_val"]["references"] = {k: diag["rows"][k] for k in ("random", "first_buy", "first_opts_buy")}
out["policy_val"]["shipped base (runs/cmp/cwh12-s0, benchmarks/results/compact_prompt.json)"] = ship["runs"]["cwh12-s0"]
out["policy_val"]["shipped base, seed 1 (runs/cmp/cwh12-s1, benchmarks/results/compact_prompt.json)"] = ship["runs"]["cwh12-s1"]
recipe = "python benchmarks/bc_options.py --data data/opt/train20k.jsonl --on-path --option-repeat {r} --steps 2100 --group-by-length --prompt compact --answer-words --seed {seed} --threads 2 --init {init} --out runs/cmp/{name}"
rows = {}
for f in ("runs/cmp/gpu_val_s0.json", "runs/cmp/gpu_val_s0_x3.json", "runs/cmp/gpu_val_s0_g6d.json", "runs/cmp/gpu_val_s1_g6d.json"):
    if Path(f).exists():
        rows.update(json.loads(Path(f).read_text())["rows"])
for name, init, r in (("g5-cwh12-s0", "runs/gpu/g5", 12), ("g6c-cwh12-s0", "runs/gpu/g6c", 12), ("g5-cwh3-s0", "runs/gpu/g5", 3), ("g6d-cwh12-s0", "runs/gpu/g6d", 12), ("g6d-cwh12-s1", "runs/gpu/g6d", 12)):
    if f"runs/cmp/{name}" in rows:
        out["policy_val"][name] = {"train_command": recipe.format(r=r, init=init, name=name, seed=name[-1]), **rows[f"runs/cmp/{name}"],
            "train_seconds": json.loads(Path(f"runs/cmp/{name}/summary.json").read_text())["seconds"]}
        ranking = out["policy_val"][name]["option_ranking"]
        ranking["ranked_first_wilson95"] = wilson(ranking["ranked_first"], ranking["option_steps"])
for key, run in out["policy_val"].items():
    if key.startswith("shipped"):
        ranking = run["val_diag"]["option_ranking"]
        ranking["ranked_first_wilson95"] = wilson(ranking["ranked_first"], ranking["option_steps"])
out["policy_val"]["score_commands"] = [diag["command"], "python benchmarks/policy_diag.py runs/cmp/g5-cwh3-s0 --split val --episodes 200 --option-data data/opt/val500.jsonl", "python benchmarks/policy_diag.py runs/cmp/g6d-cwh12-s0 --split val --episodes 200 --option-data data/opt/val500.jsonl", "python benchmarks/policy_diag.py runs/cmp/g6d-cwh12-s1 --split val --episodes 200 --option-data data/opt/val500.jsonl"]
out["policy_val"]["no_purchase_episodes"] = "python benchmarks/policy_diag.py runs/cmp/g5-cwh12-s0 runs/cmp/g6c-cwh12-s0 runs/cmp/g6d-cwh12-s0 --split val --episodes 200 --show-stalls 3: each printed no_buy episode (the right product with the right options, never bought) clicks its last option again until the step limit"
Path("benchmarks/results/gpu_base.json").write_text(json.dumps(out, indent=1) + "\n")
print("wrote benchmarks/results/gpu_base.json")
