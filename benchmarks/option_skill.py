"""Can a policy model learn to pick the option the task names, in isolation? A learnability probe.

    .venv/bin/python benchmarks/option_skill.py --train data/opt/train20k.jsonl --eval data/opt/val500.jsonl \
        --init pretrained --prompt minimal --answer typed --steps 800 --seeds 0 --out FILE.json

The shop policy's success is capped by one decision: on an item page, click the options the task names
(``size=3 seater`` when the task asks for "size 3 seater"). A scripted plan that does it scores 0.775 on val, one
that skips it 0.295, and the cloned policy scores 0.295 (``benchmarks/results/policy_levers.json``). This probe
trains on the oracle's option steps only (nothing else competes for the budget) and scores, teacher-forced on
the eval file's option steps (two or more options, no detours), the option with the highest log-probability:

* ``named_first``: it is one the task names and the history has not clicked yet (where the task names two, the
  oracle's order is one right answer of two);
* ``ranked_first``: it is the oracle's.

Beside them, trivial answers that need no matching: a random option, the most common rank, and the rank prior
(the rank the oracle takes most often on a page with that many options, from the training steps), which is what a
model learns first. ``--prompt policy`` is the agent's own prompt (task, history, state, actions); ``minimal``
keeps the task and the option actions only, so the match is all there is to learn; ``spaced`` lists each option's
value after a space (the same tokens as in the task); ``marked`` is the positive control: it marks the options
the task names, so a model that learns anything at all learns this. ``--answer typed`` answers the label
(``option 3``), ``text`` the action (``click[3 seater]``), ``named`` the shop policy's own format (numbered actions, an option
answered as its click: ``PolicyConfig.answer_by_name``). Budgets are optimiser steps of 16 examples;
``--save-steps N`` scores a checkpoint every N steps (the curve), ``--score DIR ...`` scores given weights only,
``--warmup-steps N`` first gives the init N steps of the induction warm-up (repeated random rows: the retrieval
circuit the marked control needs).
The data: ``dreamgym collect --policy noisy --noise 0.3 --env-arg val_fraction=0.1`` with ``--episodes 20000
--split train --seed 1`` and ``--episodes 500 --split val --seed 1``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dreamgym.agent.policy import (
    SYSTEM_PROMPT,
    AgentObservation,
    PolicyConfig,
    action_target,
    build_agent_prompt,
    format_action_target,
)
from dreamgym.baselines.sft import init_model, read_data
from dreamgym.sft import SFTConfig, SFTExample, encode_prompt, encode_target, train_sft

try:  # run as a script (benchmarks/ on sys.path) or as benchmarks.option_skill
    from policy_diag import option_steps, target_logprob  # type: ignore[import-not-found]
    from pretrained_base import t95  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    from benchmarks.policy_diag import option_steps, target_logprob
    from benchmarks.pretrained_base import t95


def make_prompt(obs: AgentObservation, options: list[str], cfg: PolicyConfig, kind: str) -> Any:
    if kind == "policy":
        return build_agent_prompt(obs, cfg)
    lines = [f"TASK: {obs.instruction}", "ACTIONS:"]
    if kind == "marked":  # the positive control: the task-named options carry a mark, nothing is left to match
        named = task_named(obs, options)
        lines += [f"option {i}: {a}" + (" *" if a in named else "") for i, a in enumerate(options, start=1)]
    elif kind == "spaced":  # the value alone after a space: the same tokens as in the task's words
        lines += [f"option {i}: {a[6:-1]}" for i, a in enumerate(options, start=1)]
    elif cfg.action_format == "typed":
        lines += [f"option {i}: {a}" for i, a in enumerate(options, start=1)]
    else:
        lines += options
    answer = "the label of an action, or an action" if cfg.action_format == "typed" else "ACTION"
    return [{"role": "system", "content": SYSTEM_PROMPT.format(think="", answer=answer)},
            {"role": "user", "content": "\n".join(lines)}]


def make_target(obs: AgentObservation, action: str, options: list[str], cfg: PolicyConfig, kind: str) -> str:
    if kind == "policy":
        return action_target(obs, action, cfg)
    if cfg.action_format == "typed":
        return format_action_target(f"option {options.index(action) + 1}")
    return format_action_target(action)


def evaluate(model: Any, tok: Any, steps: list[tuple[AgentObservation, str, list[str]]], cfg: PolicyConfig,
             kind: str) -> dict[str, float]:
    """Teacher-forced: how often the option with the highest log-probability is one the task names
    (``named_first``) and the oracle's (``ranked_first``)."""
    model.eval()
    hits = named = 0
    for obs, action, options in steps:
        prompt = encode_prompt(tok, make_prompt(obs, options, cfg, kind))
        scores = [target_logprob(model, prompt, encode_target(tok, make_target(obs, a, options, cfg, kind)))
                  for a in options]
        top = options[max(range(len(options)), key=scores.__getitem__)]
        hits += top == action
        named += top in task_named(obs, options)
    return {"ranked_first": hits / len(steps), "named_first": named / len(steps)}


def task_named(obs: AgentObservation, options: list[str]) -> list[str]:
    """The options whose value the task's instruction names (a substring), not yet clicked in the history: where
    the task names two options the oracle's order is one of several right answers, and this counts them all."""
    done = {a for _, a in obs.history}
    return [a for a in options if a[6:-1] in obs.instruction.lower() and a not in done]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--init", default="pretrained", help="a model (pretrained, a preset, a directory)")
    ap.add_argument("--prompt", choices=["policy", "minimal", "spaced", "marked"], default="policy")
    ap.add_argument("--answer", choices=["typed", "text", "named"], default="typed",
                    help="named: the shop policy's own format (numbered actions, an option answered as its click)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup-steps", type=int, default=0, help="first give the init this many steps of the "
                    "induction warm-up (dreamgym.pretrain.train.induction_warmup, seed 0: one warmed model for "
                    "every fine-tuning seed)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--eval-limit", type=int, default=300, help="eval option steps (the first N)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-steps", type=int, default=0, help="keep a checkpoint every N steps (0: none) and "
                    "score each after training: the learning curve")
    ap.add_argument("--score", nargs="*", default=None, metavar="DIR", help="only score these model directories "
                    "(weights; the tokenizer from --init), no training")
    ap.add_argument("--work", default="runs/option_skill")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    for path in (args.train, args.eval):
        if not Path(path).is_file():
            ap.error(f"{path}: no such data file (make it with dreamgym collect: see the docstring)")

    cfg = (PolicyConfig(action_format="index", offer_task_search=True, answer_by_name=True) if args.answer == "named"
           else PolicyConfig(action_format=args.answer, offer_task_search=True))
    train_trajs = [t for t in read_data([args.train]) if t.success]
    train = option_steps(train_trajs)
    test = option_steps(read_data([args.eval]))[: args.eval_limit]
    ranks = Counter(opts.index(a) for _, a, opts in test)
    # the trivial answer a model learns first: the rank the oracle takes most often on a page with that many options
    by_count = Counter((len(opts), opts.index(a)) for _, a, opts in train)
    prior = {n: max(range(n), key=lambda i: by_count[(n, i)]) for n in {len(o) for _, _, o in test}}
    baselines = {"rank_prior_named": sum(o[prior[len(o)]] in task_named(ob, o) for ob, _, o in test) / len(test),
                 "rank_prior_oracle": sum(o[prior[len(o)]] == a for _, a, o in test) / len(test),
                 "random_pick": sum(1 / len(o) for _, _, o in test) / len(test),
                 "random_named": sum(len(task_named(ob, o)) / len(o) for ob, _, o in test) / len(test),
                 # the reference that matches by string: named_first wherever the task names an option at all
                 "string_match_named": sum(bool(task_named(ob, o)) for ob, _, o in test) / len(test),
                 "majority_rank": ranks.most_common(1)[0][1] / len(test),
                 "majority_rank_is": ranks.most_common(1)[0][0] + 1}
    examples = [SFTExample(make_prompt(o, opts, cfg, args.prompt), make_target(o, a, opts, cfg, args.prompt))
                for o, a, opts in train]
    print(f"{len(train)} train option steps, {len(test)} eval; baselines {baselines}", flush=True)
    if args.score is not None:
        scored = {d: score_dir(d, args.init, test, cfg, args.prompt) for d in args.score}
        print(json.dumps(scored, indent=1))
        write(args, {"baselines": baselines, "eval_option_steps": len(test), "scored": scored})
        return
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        model, tok = init_model(args.init, train_trajs, examples, None, seed)
        warmup = warm_up(model, tok, args.warmup_steps, args.threads) if args.warmup_steps else None
        before = evaluate(model, tok, test, cfg, args.prompt)
        run = Path(args.work) / f"{args.prompt}-{args.answer}-s{seed}"
        t0 = time.monotonic()
        stats = train_sft(model, tok, examples, run,
                          SFTConfig(max_steps=args.steps, learning_rate=args.lr, batch_size=16, max_length=768,
                                    warmup_ratio=0.05, seed=seed, num_threads=args.threads,
                                    save_steps=args.save_steps or 10**6, save_total_limit=None),
                          resume=False)
        after = evaluate(model, tok, test, cfg, args.prompt)
        ckpts = sorted((int(c.name.split("-")[1]), c) for c in run.glob("checkpoints/checkpoint-*"))
        curve = {str(n): score_dir(str(c), str(run), test, cfg, args.prompt) for n, c in ckpts if n < args.steps}
        curve[str(args.steps)] = after  # the last checkpoint is the model just scored
        rows.append({"seed": seed, "warmup": warmup, "before": before, "after": after, "curve": curve,
                     "train_loss": stats.get("train_loss"), "epochs": stats.get("epochs"),
                     "seconds": round(time.monotonic() - t0, 1)})
        print(json.dumps(rows[-1]), flush=True)
    afters = [r["after"]["named_first"] for r in rows]
    mean = sum(afters) / len(afters)
    sd = (sum((a - mean) ** 2 for a in afters) / (len(afters) - 1)) ** 0.5 if len(afters) > 1 else 0.0
    half = t95(len(afters)) * sd / len(afters) ** 0.5 if len(afters) > 1 else None
    write(args, {"train_option_steps": len(train), "eval_option_steps": len(test), "baselines": baselines,
                 "named_first": {"mean": mean, "ci95_half": half}, "seeds": rows})
    print(json.dumps({"mean": mean, "ci95_half": half}))


def warm_up(model: Any, tok: Any, steps: int, threads: int) -> dict[str, Any]:
    import torch

    from dreamgym.pretrain.train import induction_warmup

    torch.set_num_threads(threads)
    return induction_warmup(model, tok, steps, seed=0)


def score_dir(path: str, tokenizer_from: str, steps: list[tuple[AgentObservation, str, list[str]]],
              cfg: PolicyConfig, kind: str) -> dict[str, float]:
    """:func:`evaluate` on the weights in ``path`` (a checkpoint has no tokenizer: it is ``tokenizer_from``'s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dreamgym.llm.pretrained import resolve_model

    return evaluate(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(
        resolve_model(tokenizer_from)), steps, cfg, kind)


def write(args: argparse.Namespace, result: dict[str, Any]) -> None:
    flags = " ".join(f"--{k.replace('_', '-')} {' '.join(v) if isinstance(v, list) else v}"
                     for k, v in vars(args).items() if v is not None)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": f"python benchmarks/option_skill.py {flags}", **result}, indent=2))


if __name__ == "__main__":
    main()
