"""The reward head on val: terminal reward accuracy beside the majority answer, and beside the same head reading
another task's words (the cheat: a head that does not read the task cannot beat the majority).

    python benchmarks/reward_head_val.py --train T.jsonl... --heldout V.jsonl... [--seeds 0 1 2] [--steps 1500]
        [--variants TOL:MIN_SHARE ...] [--out FILE.json]

Fits :class:`dreamgym.experience.reward_head.RewardHead` on the real endings of the training files, once per seed,
for each variant (the answer's tolerance, 0 = the most probable reward, and the smallest share of the endings a
reward class needs; the default is the head's own default), and scores each held-out file's endings (done, not cut by the step limit): the share of rewards within 0.1
(M_exp's terminal reward accuracy), the exact share (2 decimals) and success accuracy, each beside the majority
answer of that file, and the within-0.1 share when each page is judged against the next ending's task. Mean and
95% t half-width over seeds. No LM is involved: this is the head alone on real pages, as M_exp's fidelity
evaluation calls it (the held-out step's page is the real one; M_exp's done flag gates it, ~0.99 accurate).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dreamgym.experience.reward_head import Ending, RewardHead, endings
from dreamgym.experience.train import read_training_data

try:
    from pretrained_base import mean_ci  # type: ignore[import-not-found]
except ImportError:  # imported as benchmarks.reward_head_val
    from benchmarks.pretrained_base import mean_ci

# How the committed result's files were made (benchmarks/results/reward_head_val.json): the val-split data of
# benchmarks/results/gpu_base.json's exp_val (val_fraction=0.1 keeps val's target products out of train), and a
# larger noise-0.5 val set for the choice of the answer.
DATA_COMMANDS = (
    "dreamgym collect --policy noisy --noise 0.3 --episodes 2000 --split train --seed 0 --env-arg val_fraction=0.1 "
    "--out data/base/train_v2.jsonl",
    "dreamgym collect --policy noisy --noise 0.8 --episodes 800 --split train --seed 500000 --env-arg val_fraction=0.1 "
    "--out data/mix/trainv_n08.jsonl",
    "dreamgym collect --policy noisy --noise 0.5 --episodes 60 --split val --seed 100000 --env-arg val_fraction=0.1 "
    "--out data/base/val60.jsonl",
    "dreamgym collect --policy noisy --noise 0.8 --episodes 150 --split val --seed 100000 --env-arg val_fraction=0.1 "
    "--out data/mix/val150_n08.jsonl",
    "dreamgym collect --policy noisy --noise 0.5 --episodes 400 --split val --seed 200000 --env-arg val_fraction=0.1 "
    "--out data/base/val400.jsonl",
    "each but val400 annotated: dreamgym annotate --data X.jsonl --out X_ann.jsonl --annotator rule",
)


def scores(head: RewardHead, data: Sequence[Ending]) -> dict[str, float]:
    answers = head.predict_batch([(e.instruction, e.state) for e in data])
    shifted = [data[(i + 1) % len(data)].instruction for i in range(len(data))]
    other = head.predict_batch([(s, e.state) for s, e in zip(shifted, data, strict=True)])
    return {
        "terminal_reward_accuracy": float(np.mean([abs(r - e.reward) <= 0.1 + 1e-9 for (r, _), e in zip(answers, data, strict=True)])),
        "terminal_reward_exact_accuracy": float(np.mean([round(r, 2) == round(e.reward, 2) for (r, _), e in zip(answers, data, strict=True)])),
        "success_accuracy": float(np.mean([s == e.success for (_, s), e in zip(answers, data, strict=True)])),
        "other_task_terminal_reward_accuracy": float(np.mean([abs(r - e.reward) <= 0.1 + 1e-9 for (r, _), e in zip(other, data, strict=True)])),
    }


def baselines(data: Sequence[Ending]) -> dict[str, Any]:
    majority = Counter(round(e.reward, 2) for e in data).most_common(1)[0][0]
    won = Counter(e.success for e in data).most_common(1)[0][0]
    return {"endings": len(data), "majority_reward": majority,
            "terminal_reward_majority_baseline": float(np.mean([abs(majority - e.reward) <= 0.1 + 1e-9 for e in data])),
            "terminal_reward_exact_majority_baseline": float(np.mean([majority == round(e.reward, 2) for e in data])),
            "success_majority_baseline": float(np.mean([e.success == won for e in data]))}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", nargs="+", required=True)
    ap.add_argument("--heldout", nargs="+", required=True)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--variants", nargs="+", default=["0:0.003"], help="TOLERANCE:MIN_SHARE of each head to fit")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    try:
        variants = [(float(v.split(":")[0]), float(v.split(":")[1])) for v in args.variants]
    except (ValueError, IndexError):
        print(f"error: --variants takes TOLERANCE:MIN_SHARE pairs, got {args.variants}", file=sys.stderr)
        return 2
    try:
        train = endings(read_training_data(args.train))
        heldout = {p: endings(read_training_data([p])) for p in args.heldout}
    except (OSError, ValueError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if empty := [p for p, d in heldout.items() if not d]:
        print(f"error: {empty[0]}: no real ending to score", file=sys.stderr)
        return 2
    out_variants = {}
    for tolerance, min_share in variants:
        name = f"tolerance {tolerance:g}, min_share {min_share:g}"
        print(name)
        out_variants[name] = evaluate(train, heldout, args.seeds, args.steps, tolerance, min_share)
    out = {"what": "the reward head alone (dreamgym.experience.reward_head) on held-out real endings: terminal reward "
                   "accuracy (within 0.1), exact (2 decimals) and success accuracy beside each file's majority answer, "
                   "and beside the head judging each page against another ending's task; mean and 95% t half-width "
                   "over fitting seeds, for each variant of the answer",
           "command": "python benchmarks/reward_head_val.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "data_commands": list(DATA_COMMANDS), "train": args.train, "train_endings": len(train), "seeds": args.seeds,
           "variants": out_variants}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


def evaluate(train: list[Ending], heldout: dict[str, list[Ending]], seeds: Sequence[int], steps: int,
             tolerance: float, min_share: float) -> dict[str, Any]:
    per_seed: dict[str, list[dict[str, float]]] = {p: [] for p in heldout}
    fits = []
    for seed in seeds:
        t0 = time.monotonic()
        head = RewardHead.fit(train, seed=seed, steps=steps, tolerance=tolerance, min_share=min_share)
        fits.append({**head.summary, "seconds": round(time.monotonic() - t0, 1)})
        for p, data in heldout.items():
            per_seed[p].append(scores(head, data))
    results = {}
    for p, runs in per_seed.items():
        cell: dict[str, Any] = baselines(heldout[p])
        for k in runs[0]:
            values = [r[k] for r in runs]
            mean, _, half = mean_ci(values)
            cell[k] = {"per_seed": [round(v, 4) for v in values], "mean": round(mean, 4), "half_width": round(half, 4)}
        results[p] = cell
        print(f"{p}: {cell['endings']} endings; terminal reward acc {cell['terminal_reward_accuracy']['mean']:.3f} "
              f"± {cell['terminal_reward_accuracy']['half_width']:.3f} (majority {cell['terminal_reward_majority_baseline']:.3f}; "
              f"another task's words {cell['other_task_terminal_reward_accuracy']['mean']:.3f}); exact "
              f"{cell['terminal_reward_exact_accuracy']['mean']:.3f} (majority {cell['terminal_reward_exact_majority_baseline']:.3f}); "
              f"success {cell['success_accuracy']['mean']:.3f} (majority {cell['success_majority_baseline']:.3f})")
    return {"fits": fits, "heldout": results}


if __name__ == "__main__":
    raise SystemExit(main())
