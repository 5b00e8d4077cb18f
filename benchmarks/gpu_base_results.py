"""Collects ``benchmarks/results/gpu_base.json`` (README, "A base warmed up on a GPU") from the run directories the
commands in it write: the GPU bases' manifests (``runs/gpu/NAME``, unpacked from the device call's ``NAME.tar``),
the CPU continuations, ``benchmarks/match_finished.py``'s output and ``benchmarks/policy_diag.py``'s, M_exp
fine-tuned from the continued base beside the shipped one (``benchmarks/pretrained_base.py --part exp``'s
``runs/xb/exp_bases_val.json``), the same script's one-process default run on the CPU instead (``runs/cpu6/g6``, its
probes, its M_exp and its policies), and adds the 95% Wilson intervals the README quotes
(:func:`dreamgym.stats.wilson_interval`).

    python benchmarks/gpu_base_results.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dreamgym.stats import wilson_interval

DEVICE = "torch 2.11.0+cu130 cuda True NVIDIA H200"  # what the device call printed (its device.txt)


def wilson(share: float, n: int) -> list[float]:
    return [round(x, 3) for x in wilson_interval(round(share * n), n)]


BASES = ("g4", "g5", "g5w")  # unpacked from the device call's tars
# g5 continued on the CPU (g6c, g6d: recipe 6's match warm-up; g6m: g6d with 6M tokens of recipe 6's mixture, which
# brings back the M_exp formats the warm-ups left out); each manifest holds its command
CONTINUED = ("g6c", "g6d", "g6m")
POLICIES = ("g5-cwh12-s0", "g6c-cwh12-s0", "g5-cwh3-s0", "g6d-cwh12-s0", "g6d-cwh12-s1", "g6m-cwh12-s0")  # runs/cmp/NAME
SCORES = ("runs/cmp/gpu_val_s0.json", "runs/cmp/gpu_val_s0_x3.json", "runs/cmp/gpu_val_s0_g6d.json",
          "runs/cmp/gpu_val_s1_g6d.json", "runs/cmp/gpu_val_s0_g6m.json")  # policy_diag.py --out files, with commands
# M_exp from the shipped base and from g6m, the bench's settings (150 steps of 16), val, seed 0 (data: its commands)
EXP_VAL = "runs/xb/exp_bases_val.json"
EXP_DATA = ["dreamgym collect --policy noisy --noise 0.3 --episodes 2000 --split train --seed 0 --env-arg val_fraction=0.1 "
            "--out data/base/train_v2.jsonl",
            "dreamgym collect --policy noisy --noise 0.8 --episodes 800 --split train --seed 500000 --env-arg "
            "val_fraction=0.1 --out data/mix/trainv_n08.jsonl",
            "dreamgym collect --policy noisy --noise 0.5 --episodes 60 --split val --seed 100000 --env-arg "
            "val_fraction=0.1 --out data/base/val60.jsonl",
            "dreamgym collect --policy noisy --noise 0.8 --episodes 150 --split val --seed 100000 --env-arg "
            "val_fraction=0.1 --out data/mix/val150_n08.jsonl",
            "each annotated: dreamgym annotate --data X.jsonl --out X_ann.jsonl --annotator rule"]
# Recipe 6 in one process, as benchmarks/gpu/pretrain_base.sh runs it (copy 1,200 and match 4,000 warm-up steps, then
# 12M mixture tokens), run on the 2 CPU cores instead (2026-12-05, session 9): the device call's base, without a device.
CPU_BASE = "runs/cpu6/g6"
CPU_EXP = "runs/xb/exp_cpu6_val.json"  # its M_exp, the bench's 150 steps, val, seed 0
CPU_POLICIES = tuple((f"cpu6-cwh12-s{s}", f"runs/cmp/gpu_val_s{s}_cpu6.json") for s in range(3))  # its policies (the
# 600 s recipe, training seeds 0-2) and their val scores; then all three on test beside the shipped base's (CPU_TEST)
CPU_TEST = "runs/cmp/cpu6_test.json"
# seed 0 again with bc_options.py --flush-denormal: its run, val score and test score against the run without it
CPU_FLUSH = ("runs/cmp/cpu6fd-cwh12-s0", "runs/cmp/gpu_val_s0_cpu6fd.json", "runs/cmp/cpu6fd_test.json")
PROBE = "dreamgym model probe {} --json"  # the copy and answer probes, printed for each base (CPU_PROBES)
CPU_PROBES = "runs/cpu6/probes.json"
SHIPPED = {"shipped base (runs/cmp/cwh12-s0, benchmarks/results/compact_prompt.json)": "cwh12-s0",
           "shipped base, seed 1 (runs/cmp/cwh12-s1, benchmarks/results/compact_prompt.json)": "cwh12-s1"}


def read(path: str) -> dict[str, Any]:
    return dict(json.loads(Path(path).read_text()))


def with_interval(ranking: dict[str, Any]) -> dict[str, Any]:
    """An option ranking (policy_diag.py) with the Wilson interval of its ranked-first share."""
    return {**ranking, "ranked_first_wilson95": wilson(ranking["ranked_first"], ranking["option_steps"])}


def main() -> None:
    out: dict[str, Any] = {
        "what": "Bases warmed up on one H200 (benchmarks/gpu/pretrain_base.sh; three processes at once, CAP 450 s), "
                "and the shop policy cloned from them on the CPU (val, 200 tasks, greedy; training seed 0, and seed 1 "
                "for g6d), beside the shipped base's; and M_exp fine-tuned from g6m (g6d plus 6M tokens of recipe 6's mixture "
                "on the CPU) beside the shipped base's, the bench's 150 steps, val, seed 0 (exp_val); and the script's "
                "one-process default run on the 2 CPU cores instead, checked on both models (cpu_one_process).",
        "device_run": {"command": "run(command='bash benchmarks/gpu/pretrain_base.sh', carry=['.whl'], timeout_s=590)",
                       "variants_then": "g4 128x4 4 1200 6000 24000000 / g5 128x4 5 1200 6000 24000000 / g5w 160x6 5 "
                                        "1200 6000 24000000 (NAME PRESET CORPUS COPY_STEPS MATCH_STEPS TOKENS), CAP=450",
                       "device": DEVICE, "wall_s": 556.2},
        "bases": {}, "continued": {}, "policy_val": {},
    }
    for n in BASES:
        m = read(f"runs/gpu/{n}/MANIFEST.json")
        out["bases"][n] = {k: m[k] for k in ("command", "preset", "params", "corpus_version", "copy_warmup",
                                              "match_warmup", "steps", "planned_steps", "time_cap_fired",
                                              "prep_seconds", "copy_probe", "answer_probe")}
        out["bases"][n]["model_sha256"] = m["files"]["model.safetensors"]
        out["bases"][n]["match_warmup"]["accuracy_wilson95"] = wilson(m["match_warmup"]["accuracy"], 64)
    for n in CONTINUED:
        m = read(f"runs/gpu/{n}/MANIFEST.json")
        out["continued"][n] = {k: m[k] for k in ("command", "init", "corpus_version", "match_warmup", "steps",
                                                  "train_seconds", "copy_probe")}
    out["match_finished"] = read("runs/gpu/match_finished.json")
    scores = [read(f) for f in SCORES]
    rows = {k: v for score in scores for k, v in score["rows"].items()}
    policy = out["policy_val"]
    policy["references"] = {k: rows[k] for k in ("random", "first_buy", "first_opts_buy")}
    shipped = read("benchmarks/results/compact_prompt.json")["runs"]
    for key, run in SHIPPED.items():
        policy[key] = {**shipped[run], "val_diag": {**shipped[run]["val_diag"], "option_ranking": with_interval(
            shipped[run]["val_diag"]["option_ranking"])}}
    for name in POLICIES:
        summary = read(f"runs/cmp/{name}/summary.json")
        row = rows[f"runs/cmp/{name}"]
        policy[name] = {"train_command": summary["command"], **row,
                        "option_ranking": with_interval(row["option_ranking"]), "train_seconds": summary["seconds"]}
    policy["score_commands"] = [score["command"] for score in scores]
    exp = read(EXP_VAL)
    out["exp_val"] = {"data_commands": EXP_DATA, "commands": exp["commands"],
                      "cells": {k: c for k, c in exp["cells"].items() if k.endswith("/0")},  # seed 0: the comparison
                      # g5's run trained (the first command) and was stopped in its evaluation, which resampled
                      # most outputs: its loss after the same 150 steps is the figure it has
                      "train_loss": {d.name: read(f"{d}/summary.json")["train_loss"]
                                     for d in sorted(Path("runs/xb/exp").glob("*-s0"))}}
    m = read(f"{CPU_BASE}/MANIFEST.json")
    cpu_exp = read(CPU_EXP)
    out["cpu_one_process"] = {
        "what": "benchmarks/gpu/pretrain_base.sh's default variant (recipe 6, one process, warm-ups and mixture "
                "together), run on the 2 CPU cores; checked as an M_exp base (exp_val's protocol) and as a policy base "
                "(policy_val's recipe)",
        "base": {k: m[k] for k in ("command", "preset", "params", "corpus_version", "copy_warmup", "match_warmup",
                                   "steps", "tokens_seen", "train_loss", "train_seconds", "prep_seconds",
                                   "time_cap_fired", "machine")},
        "probes": {"command": PROBE.format("BASE"), **read(CPU_PROBES)},
        "exp_val": {"commands": cpu_exp["commands"], "cells": cpu_exp["cells"]},
        "policy_val": {},
    }
    for name, score_file in CPU_POLICIES:
        score, summary = read(score_file), read(f"runs/cmp/{name}/summary.json")
        row = score["rows"][f"runs/cmp/{name}"]
        out["cpu_one_process"]["policy_val"][name] = {
            "train_command": summary["command"], **row, "option_ranking": with_interval(row["option_ranking"]),
            "success_wilson95": wilson(row["success"], row["episodes"]), "train_seconds": summary["seconds"],
            "score_command": score["command"]}
    out["cpu_one_process"]["policy_test"] = read(CPU_TEST)  # bc_options.py --score ... --against (its command)
    fd_run, fd_val, fd_test = CPU_FLUSH
    fd_score = read(fd_val)
    out["cpu_one_process"]["flush_denormal_s0"] = {
        "summary": read(f"{fd_run}/summary.json"), "val": fd_score["rows"][fd_run], "val_command": fd_score["command"],
        "test_against_s0": read(fd_test)}
    policy["no_purchase_episodes"] = (
        "python benchmarks/policy_diag.py runs/cmp/g6d-cwh12-s0 runs/cmp/g5-cwh12-s0 runs/cmp/g6c-cwh12-s0 --split "
        "val --episodes 200 --show-stalls 2: each printed no_buy episode (the right product with the right options, "
        "never bought) clicks its last option again until the step limit")
    Path("benchmarks/results/gpu_base.json").write_text(json.dumps(out, indent=1) + "\n")
    print("wrote benchmarks/results/gpu_base.json")


if __name__ == "__main__":
    main()
