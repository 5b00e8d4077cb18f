"""The ``words``-tokenizer base against the shipped base on val: the policy's success and option ranking after
behaviour cloning, M_exp's fidelity, and the answer probe, seed by seed, with paired differences.

The runs it reads (each a committed command; the JSON records them):

    dreamgym model pretrain --out runs/base_words --preset 128x4 --tokens 13500000 --seed 0 --threads 1 \
        --group-by-length --tokenizer-style words --max-length 1024
    dreamgym model probe runs/base_words --json > runs/wordtok/probe.json
    python benchmarks/pretrained_base.py --part policy --train data/base/train_v.jsonl --inits pretrained \
        --seeds 0 1 2 --budget 600 --time-cap 2400 --policy-steps 125 --eval-split val --policy-max-length 768 \
        --answer-by-name --work runs/bc/E --out runs/bc/E.json
    python benchmarks/pretrained_base.py --part policy --train data/base/train_v.jsonl \
        --inits words=runs/base_words --seeds 0 1 2 --budget 600 --time-cap 2400 --policy-steps 125 \
        --eval-split val --policy-max-length 1024 --answer-by-name --work runs/wordtok --out runs/wordtok/policy.json
    python benchmarks/policy_diag.py RUN/policy/INIT-sS ... --split val --episodes 200 --option-data data/base/val.jsonl
    python benchmarks/pretrained_base.py --part exp --train data/base/train_v_ann.jsonl data/mix/trainv_n08_ann.jsonl \
        --heldout data/base/val_ann.jsonl --extra-heldout data/mix/val_n08_ann.jsonl --inits INIT --seeds S \
        --budget 2400 --steps 150 --points 2400 [--set sft.max_length=1024]

The policy's prompt is longer in the words style (median 610 tokens against 438), so it gets 1024 tokens where the
shipped base gets 768: neither cuts a prompt. Step budgets are the same (125 steps of 32; M_exp 150 of 16).

    python benchmarks/words_base.py --out benchmarks/results/words_base.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

T95 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776}
POLICY_KEYS = ("success_rate", "mean_reward", "invalid_action_rate")
EXP_KEYS = ("terminal_reward_accuracy", "terminal_reward_majority_baseline", "terminal_reward_exact_accuracy",
            "done_accuracy", "done_majority_baseline", "invalid_output_rate", "next_state_exact", "next_state_f1",
            "click_consistency", "reward_consistency")


def paired(a: list[float], b: list[float]) -> dict[str, Any]:
    """Mean of each side and of the per-seed difference b - a, with its 95% t interval (n >= 2)."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    out: dict[str, Any] = {"a": a, "b": b, "a_mean": statistics.fmean(a), "b_mean": statistics.fmean(b),
                           "diff_mean": statistics.fmean(d)}
    if len(d) >= 2:
        half = T95.get(len(d), 1.96) * statistics.stdev(d) / len(d) ** 0.5
        out["diff_ci"] = [out["diff_mean"] - half, out["diff_mean"] + half]
    return out


def cells(path: Path, init: str) -> dict[int, dict[str, Any]]:
    got = json.loads(path.read_text())["cells"]
    return {c["seed"]: c for c in got.values() if c["init"] == init}


def ranking(paths: list[Path]) -> dict[str, float]:
    """Option ranked first, per policy run (benchmarks/policy_diag.py's output)."""
    out = {}
    for p in paths:
        for run, row in json.loads(p.read_text())["rows"].items():
            if "option_ranking" in row:
                out[run] = row["option_ranking"]["ranked_first"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy-a", type=Path, default=Path("runs/bc/E.json"))
    ap.add_argument("--policy-b", type=Path, default=Path("runs/wordtok/policy.json"))
    ap.add_argument("--diag", nargs="*", type=Path, default=[])
    ap.add_argument("--exp-a", nargs="*", type=Path, default=[])
    ap.add_argument("--exp-b", nargs="*", type=Path, default=[])
    ap.add_argument("--probe-a", type=Path, default=None)
    ap.add_argument("--probe-b", type=Path, default=Path("runs/wordtok/probe.json"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result: dict[str, Any] = {"commands": __doc__.split("\n\n")[1]}
    pa, pb = cells(args.policy_a, "pretrained"), cells(args.policy_b, "words")
    seeds = sorted(set(pa) & set(pb))
    result["policy"] = {"seeds": seeds, **{k: paired([pa[s][k] for s in seeds], [pb[s][k] for s in seeds])
                                         for k in POLICY_KEYS}}
    ranks = ranking(args.diag)
    ra = [v for k, v in sorted(ranks.items()) if "/pretrained-s" in k]
    rb = [v for k, v in sorted(ranks.items()) if "/words-s" in k]
    if ra and len(ra) == len(rb):
        result["policy"]["option_ranked_first"] = paired(ra, rb)
    ea = {c["seed"]: c for p in args.exp_a for c in json.loads(p.read_text())["cells"].values()}
    eb = {c["seed"]: c for p in args.exp_b for c in json.loads(p.read_text())["cells"].values()}
    eseeds = sorted(set(ea) & set(eb))
    if eseeds:
        result["exp"] = {"seeds": eseeds, **{k: paired([ea[s][k] for s in eseeds], [eb[s][k] for s in eseeds])
                                             for k in EXP_KEYS}}
        result["exp"]["noise08_terminal_reward_accuracy"] = paired(
            [ea[s]["extra"]["terminal_reward_accuracy"] for s in eseeds],
            [eb[s]["extra"]["terminal_reward_accuracy"] for s in eseeds])
        result["exp"]["noise08_terminal_reward_majority_baseline"] = [
            ea[s]["extra"]["terminal_reward_majority_baseline"] for s in eseeds]
    for side, path in (("a", args.probe_a), ("b", args.probe_b)):
        if path is not None and path.is_file():
            result[f"probe_{side}"] = json.loads(path.read_text())
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
