"""Whether a base knows when the option choice is over: teacher-forced whole-answer accuracy on held-out ``match``
examples in the shop policy's word-answer format (:data:`~dreamgym.pretrain.corpus.WORDS_CONFIG`), split into
finished pages (every option the task names is selected: the answer is the page's buy button, whose label varies by
site) and open pages (the answer is a named value not yet selected), each beside its majority answer's share.

A policy cloned from a base that warmed up on open pages only clicked its last option again instead of buying
(README, "A base warmed up on a GPU"); this measures that habit in the base itself, before any cloning.

    python benchmarks/match_finished.py runs/gpu/g5 runs/gpu/g6c runs/gpu/g6d --out F
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

FINISHED_SEED, OPEN_SEED = 10_000, 20_000  # held-out streams: neither a warm-up's nor the probes' seeds


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dreamgym.llm.pretrained import resolve_model
    from dreamgym.pretrain.corpus import example_of, match_baselines
    from dreamgym.pretrain.train import answer_accuracy

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bases", nargs="+", help="base directories")
    ap.add_argument("--examples", type=int, default=64, help="held-out examples of each kind")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    paths = {base: resolve_model(base) for base in args.bases}  # 'pretrained' is the shipped base
    for base, path in paths.items():
        if not (Path(path) / "config.json").is_file():
            print(f"match_finished.py: {base}: not a model directory (no config.json)", file=sys.stderr)
            sys.exit(2)
    torch.set_num_threads(args.threads)
    finished = [example_of("match", random.Random(FINISHED_SEED + i), compact=True, words=True, finished_share=1.0)
                for i in range(args.examples)]
    open_pages = [example_of("match", random.Random(OPEN_SEED + i), compact=True, words=True)
                  for i in range(args.examples)]
    out: dict[str, object] = {"command": "python benchmarks/match_finished.py " + " ".join(args.bases)
                              + f" --examples {args.examples}",
                              "open_page_baselines": match_baselines(open_pages), "bases": {}}  # finished: none
    print("open pages, answers that need no matching:", json.dumps(out["open_page_baselines"]), flush=True)
    for base in args.bases:
        model, tok = AutoModelForCausalLM.from_pretrained(paths[base]), AutoTokenizer.from_pretrained(paths[base])
        row = {"finished_page_buys": answer_accuracy(model, tok, "match", finished),
               "open_page_named_value": answer_accuracy(model, tok, "match", open_pages)}
        out["bases"][base] = row  # type: ignore[index]
        print(base, json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
