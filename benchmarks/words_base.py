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

The policy's prompt is longer in the words style (median 615 tokens against 437 on the BC prompts of
data/base/train_v.jsonl, 8% over 768: ``prompt_tokens`` in the output), so it gets 1024 tokens where the
shipped base gets 768: neither cuts a prompt. Step budgets are the same (125 steps of 32; M_exp 150 of 16).

    python benchmarks/words_base.py --diag runs/wordtok/diag_E.json runs/wordtok/diag_E12.json \
        runs/wordtok/diag_words.json runs/wordtok/diag_words12.json --exp-a runs/mixC/E.json \
        --exp-b runs/wordtok/exp.json --probe-a runs/wordtok/probe_shipped.json \
        --prompt-data data/base/train_v.jsonl --out benchmarks/results/words_base.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from pretrained_base import t95  # benchmarks/ is on sys.path when this script runs

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
        half = t95(len(d)) * statistics.stdev(d) / len(d) ** 0.5
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


def prompt_tokens(data: Path, bases: dict[str, str]) -> dict[str, dict[str, float]]:
    """Per base: the median token count of the policy's behaviour-cloning prompts on ``data`` (the E config's
    prompts), and the share over 768 and over 1024 tokens."""
    from transformers import AutoTokenizer

    from dreamgym.agent.policy import PolicyConfig
    from dreamgym.baselines.sft import bc_examples
    from dreamgym.llm.pretrained import resolve_model
    from dreamgym.sft import encode_prompt
    from dreamgym.types import read_trajectories

    cfg = PolicyConfig(action_format="index", offer_task_search=True, answer_by_name=True)
    prompts = [ex.prompt for ex in bc_examples(list(read_trajectories(data)), cfg)]
    out = {}
    for name, base in bases.items():
        tok = AutoTokenizer.from_pretrained(resolve_model(base))
        n = [len(encode_prompt(tok, p)) for p in prompts]
        out[name] = {"median": statistics.median(n), "over_768": sum(x > 768 for x in n) / len(n),
                     "over_1024": sum(x > 1024 for x in n) / len(n), "prompts": len(n)}
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
    ap.add_argument("--prompt-data", type=Path, default=None, help="trajectories whose BC prompts are measured")
    ap.add_argument("--base-b", default="runs/base_words", help="the words base (for --prompt-data)")
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
    if args.prompt_data is not None:
        result["prompt_tokens"] = prompt_tokens(args.prompt_data, {"a": "pretrained", "b": args.base_b})
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
