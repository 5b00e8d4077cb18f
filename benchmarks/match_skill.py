"""Does the corpus's ``match`` skill form in isolation, and when? A learnability curve for a base or a fresh model.

    .venv/bin/python benchmarks/match_skill.py --init runs/mbase/A --format minimal --steps 1500 --out F.json
    .venv/bin/python benchmarks/match_skill.py --fresh words --echo-steps 1200 --format full --steps 2000 --out F.json

``match`` (``dreamgym.pretrain.corpus.match_step``) is the shop policy's option choice on made-up sites: an item page
whose task names option values, answered as the click of the first named value not yet selected. The option
values, task words and the named value's rank are drawn afresh, so only finding which listed value appears in the
task predicts the answer. This trains on match examples only (16 a step, AdamW at ``--lr`` with 50 warm-up steps,
clipped gradients) and prints, every ``--eval-every`` steps, the share of 128 held-out examples whose whole target
is predicted right (teacher-forced), beside the answers that need no matching on the same held-out examples
(``dreamgym.pretrain.corpus.match_baselines``: a random option value 0.308, the first unselected option 0.250).

``--format full`` is the agent prompt the corpus trains (system text, task, history, the item page, numbered
actions); ``minimal`` keeps the task and the actions only, so any earlier showing of a value is the task's.
``--fresh bytes|words`` starts from a fresh 128x4 with a corpus-4 tokenizer of that style (``words``: a word is the
same tokens wherever it stands, so ``grar`` in the task and in ``click[grar]`` share tokens; under ``bytes`` they
do not: ``Ġgr ar`` against ``gr ar``) and ``--echo-steps N`` first gives it the copy warm-up
(``dreamgym.pretrain.train.copy_warmup``, seed 0). Budgets are optimiser steps.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from dreamgym.pretrain.corpus import example_of, match_baselines
from dreamgym.pretrain.train import echo_batch
from dreamgym.sft import SFTExample, encode_prompt

TRAIN_SEED, EVAL_SEED, EVAL_EXAMPLES, FINAL_SEED = 77, 5, 128, 6


def match_example(rng: random.Random, fmt: str) -> SFTExample:
    ex = example_of("match", rng, compact=True)
    if fmt == "full":
        return ex
    user = ex.prompt[-1]["content"]
    task = user.split("\n", 1)[0]
    actions = user.split("ACTIONS:\n", 1)[1]
    return SFTExample([{"role": "user", "content": f"{task}\nACTIONS:\n{actions}"}], ex.target)


def whole_target_accuracy(model: Any, tok: Any, fmt: str, seed: int = EVAL_SEED, n: int = EVAL_EXAMPLES) -> float:
    import torch

    rng = random.Random(seed)
    model.eval()
    right = 0
    with torch.no_grad():
        for _ in range(n):
            ex = match_example(rng, fmt)
            prompt = encode_prompt(tok, ex.prompt)
            target = tok(ex.target, add_special_tokens=False).input_ids
            pred = model(torch.tensor([prompt + target])).logits[0, len(prompt) - 1 : -1].argmax(-1)
            right += int((pred == torch.tensor(target)).all())
    model.train()
    return right / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--init", default=None, help="a base directory (or give --fresh)")
    ap.add_argument("--fresh", choices=["bytes", "words"], default=None, help="a fresh 128x4 with this tokenizer style")
    ap.add_argument("--echo-steps", type=int, default=0, help="copy warm-up steps first (with --fresh)")
    ap.add_argument("--format", choices=["minimal", "full"], default="minimal")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--final-eval", type=int, default=0, help="at the end, score this many other held-out examples "
                    "(seed 6), beside their baselines")
    ap.add_argument("--save", default=None, help="save the trained model here")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if (args.init is None) == (args.fresh is None):
        ap.error("give one of --init and --fresh")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    if args.fresh:
        from dreamgym.llm.tiny import build_model, tiny_shape
        from dreamgym.pretrain.train import base_tokenizer

        tok = base_tokenizer(0, 2048, "4", args.fresh)
        model = build_model(tiny_shape("128x4"), tok, seed=0)  # type: ignore[arg-type]
    else:
        tok = AutoTokenizer.from_pretrained(args.init)
        model = AutoModelForCausalLM.from_pretrained(args.init)
    echo = None
    if args.echo_steps:
        from dreamgym.pretrain.train import copy_warmup

        echo = copy_warmup(model, tok, args.echo_steps, 0)
        print("echo", echo, flush=True)
    rng = random.Random(TRAIN_SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    eval_rng = random.Random(EVAL_SEED)
    baselines = match_baselines([match_example(eval_rng, "full") for _ in range(EVAL_EXAMPLES)])
    print("baselines", baselines, flush=True)
    curve = {0: whole_target_accuracy(model, tok, args.format)}
    print(0, curve[0], flush=True)
    t0 = time.monotonic()
    model.train()
    for step in range(1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, step / 50)
        loss = model(**echo_batch(tok, [match_example(rng, args.format) for _ in range(16)], 768)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % args.eval_every == 0:
            curve[step] = whole_target_accuracy(model, tok, args.format)
            print(step, round(float(loss.detach()), 3), curve[step], round(time.monotonic() - t0), flush=True)
    final = None
    if args.final_eval:
        final_rng = random.Random(FINAL_SEED)
        acc = whole_target_accuracy(model, tok, args.format, FINAL_SEED, args.final_eval)
        half = 1.96 * (acc * (1 - acc) / args.final_eval) ** 0.5  # a binomial (normal-approximation) 95% interval
        final = {"examples": args.final_eval, "accuracy": acc, "ci95": [round(acc - half, 3), round(acc + half, 3)],
                 **match_baselines([match_example(final_rng, "full") for _ in range(args.final_eval)])}
        print("final", final, flush=True)
    if args.save:
        model.save_pretrained(args.save)
        tok.save_pretrained(args.save)
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": f"python benchmarks/match_skill.py {flags}", "echo_warmup": echo,
                                          "baselines": baselines, "curve": curve, "final": final, "seconds": round(time.monotonic() - t0, 1)}, indent=1))


if __name__ == "__main__":
    main()
