"""Behaviour cloning with the option steps repeated: does the shop policy learn the option choice when it sees
enough of them?

    .venv/bin/python benchmarks/bc_options.py --data data/opt/train20k.jsonl --option-repeat 6 --steps 1000 \
        --out runs/bc_options/r6-s0
    .venv/bin/python benchmarks/bc_options.py --data data/opt/train20k.jsonl --option-repeat 6 --steps 1500 \
        --init runs/bc_options/r6-s0 --seed 1 --out runs/bc_options/r6-s0-more   # the README's policy

(``benchmarks/results/bc_options.json``: both stages, with val and test scores.) The same recipe in one stage, three
training seeds, with a learning curve (every 500 steps saved as a policy run dir ``OUT/curve/step-N``)::

    .venv/bin/python benchmarks/bc_options.py --data data/opt/train20k.jsonl --option-repeat 6 --steps 2500 \
        --group-by-length --keep-checkpoints --seed S --out runs/bc_fast/g-sS

On-path cloning (``--on-path``: each trajectory only up to its first detour, ``dreamgym.baselines.on_path``), the
600 s probes and three training seeds of the 2,500-step recipe (``bc_options.json``: ``on_path_600s``, ``on_path``)::

    .venv/bin/python benchmarks/bc_options.py --data data/opt/train20k.jsonl --on-path --option-repeat 6 \
        --steps 900 --lr 3e-3 --group-by-length --out runs/fast600/e1                   # ~510 s
    .venv/bin/python benchmarks/bc_options.py --data data/opt/train20k.jsonl --on-path --option-repeat 6 \
        --steps 2500 --group-by-length --seed S --out runs/onpath/p-sS

Shorter prompts and word answers (``--prompt compact``: ``PolicyConfig.prompt``; ``--answer-words``:
``PolicyConfig.answer_words``), 2,100 steps in ~580 s on 2 cores (``benchmarks/results/compact_prompt.json``)::

    .venv/bin/python benchmarks/bc_options.py --data data/opt/train20k.jsonl --on-path --option-repeat 12 \
        --steps 2100 --group-by-length --prompt compact --answer-words --seed S --out runs/cmp/cwh12-sS

``benchmarks/option_skill.py`` finds that a model trained on the oracle's option steps alone learns to rank the
option the task names first when it writes the option's text (``--answer text``), after some 10k option examples,
and not when it answers a label. In plain cloning, option steps are a small share of the examples, and the
demo's budget shows the policy a few hundred. This script clones the shop's default policy (numbered actions,
options and buttons written as text, the task search offered: ``dreamgym.envs``' shop spec) from the shipped base
on every successful trajectory of ``--data``, each option step repeated ``--option-repeat`` times (an option step:
the oracle clicks an option on an item page of two or more options, ``benchmarks.policy_diag.option_steps``), and
saves a policy run dir. Score it with ``dreamgym eval --policy RUN --split val --env-arg val_fraction=0.1
--episodes 200 [--decoding admissible]``. Budgets are optimiser steps.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from pathlib import Path

from dreamgym.agent.policy import PolicyConfig, action_target, build_agent_prompt, save_policy
from dreamgym.baselines.sft import bc_examples, init_model, on_path, read_data
from dreamgym.envs import spec
from dreamgym.envs.shop.pages import option_step, page_type
from dreamgym.sft import SFTConfig, SFTExample, encode_prompt, encode_target, train_sft
from dreamgym.types import Trajectory, Transition

try:  # run as a script (benchmarks/ on sys.path) or as benchmarks.bc_options
    from policy_diag import option_steps  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    from benchmarks.policy_diag import option_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data")
    ap.add_argument("--init", default="pretrained")
    ap.add_argument("--option-repeat", type=int, default=1, help="copies of each option step (1: plain cloning)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--on-path", action="store_true", help="clone each trajectory only up to its first detour (the "
                    "states the oracle itself reaches), not the oracle's recoveries from the noise's detours")
    ap.add_argument("--prompt", choices=["full", "compact"], default="full", help="the policy prompt (PolicyConfig."
                    "prompt; compact: about a third fewer tokens a step)")
    ap.add_argument("--answer-words", action="store_true", help="answer an option or button click by its words "
                    "after a space, as the task spells them (PolicyConfig.answer_words)")
    ap.add_argument("--group-by-length", action="store_true", help="batch examples of similar length (less padding)")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep every checkpoint (a learning curve), not 2, "
                    "and save each as a policy run dir OUT/curve/step-N")
    ap.add_argument("--export-curve", metavar="RUN", help="no training: save each checkpoint of RUN as a policy run dir "
                    "RUN/curve/step-N (score them with benchmarks/policy_diag.py RUN/curve/step-*)")
    ap.add_argument("--label-mix", action="store_true", help="no training: count --data's cloned steps by page and "
                    "action kind, all of them and on-path only (what --on-path leaves out)")
    ap.add_argument("--prompt-tokens", action="store_true", help="no training: the mean tokens (prompt and target, "
                    "the init's tokenizer) of --data's examples, option examples and mixed stream in this format")
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="no training: play both policies' greedy "
                    "episodes on the same --split tasks and print A - B success per task (paired bootstrap, sign test)")
    ap.add_argument("--score", nargs="+", metavar="RUN", help="no training: play each run's (one training seed each) "
                    "greedy episodes on the same --split tasks, free and guided; success as mean and a bootstrap CI "
                    "over seeds and tasks, and minus the scripted 'search, first result, buy' plan per task")
    ap.add_argument("--against", nargs="+", metavar="RUN", help="--score: also the paired difference to another "
                    "recipe's runs, the i-th run of each (the same training seed) on the same tasks")
    ap.add_argument("--flush-denormal", action="store_true", help="torch.set_flush_denormal(True) before training: a "
                    "trained base's backward pass makes subnormal floats, which these CPUs compute slowly "
                    "(benchmarks/base_step_speed.py)")
    ap.add_argument("--split", choices=["val", "test"], default="test")
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--decoding", choices=["free", "admissible"], default=None, help="--compare: override both runs'")
    args = ap.parse_args()
    if args.against and not args.score:
        ap.error("--against compares with the runs of --score RUN...")
    if args.label_mix and not args.data:
        ap.error("--label-mix counts the labels of --data FILE")
    if args.compare:
        compare(args)
        return
    if args.score:
        score(args)
        return
    if args.export_curve:
        print("\n".join(map(str, export_curve(Path(args.export_curve)))))
        return
    if args.label_mix:
        print(json.dumps(label_mix([t for t in read_data([args.data]) if t.success]), indent=1))
        return
    if not args.data or not (args.out or args.prompt_tokens):
        ap.error("--data and --out are required to train (or --compare RUN_A RUN_B, or --export-curve RUN)")
    if not Path(args.data).is_file():
        ap.error(f"{args.data}: no such data file (dreamgym collect --policy noisy --noise 0.3 --env-arg "
                 "val_fraction=0.1 --episodes 20000 --split train --seed 1 --out FILE)")
    if args.option_repeat < 1:
        ap.error("--option-repeat must be >= 1")

    # the shop demo's policy format, from its EnvSpec
    cfg = PolicyConfig(**{**spec("shop").demo_defaults["policy"], "prompt": args.prompt,
                          "answer_words": args.answer_words})
    trajs = [t for t in read_data([args.data]) if t.success]
    if args.on_path:
        trajs = [on_path(t) for t in trajs]
    examples = bc_examples(trajs, cfg)
    # the option steps' examples again (the same prompt and target bc_examples made for them), repeat - 1 times:
    # the multiset bc_examples(trajs, cfg, decision_repeat=K) gives, kept in this order so that the committed runs'
    # data order (and so their numbers) reproduce
    options = [SFTExample(build_agent_prompt(obs, cfg), action_target(obs, action, cfg))
               for obs, action, _ in option_steps(trajs)]
    mixed = examples + options * (args.option_repeat - 1)
    random.Random(args.seed).shuffle(mixed)
    print(json.dumps({"examples": len(examples), "option_examples": len(options), "mixed": len(mixed)}), flush=True)
    model, tok = init_model(args.init, trajs, mixed, None, args.seed)
    if args.prompt_tokens:
        def mean_tokens(exs: list[SFTExample]) -> float:
            return round(sum(len(encode_prompt(tok, e.prompt)) + len(encode_target(tok, e.target)) for e in exs)
                         / len(exs), 1)
        plain, option = mean_tokens(examples), mean_tokens(options)
        mixed_mean = (plain * len(examples) + option * len(options) * (args.option_repeat - 1)) / len(mixed)
        print(json.dumps({"prompt": args.prompt, "answer_words": args.answer_words, "examples": plain,
                          "option_examples": option, "mixed": round(mixed_mean, 1)}))
        return
    run = Path(args.out)
    if args.flush_denormal:
        import torch

        if not torch.set_flush_denormal(True):
            ap.error("--flush-denormal: this CPU does not support it")
    t0 = time.monotonic()
    stats = train_sft(model, tok, mixed, run / "model",
                      SFTConfig(max_steps=args.steps, learning_rate=args.lr, batch_size=args.batch_size,
                                max_length=768, warmup_ratio=0.05, seed=args.seed, num_threads=args.threads,
                                group_by_length=args.group_by_length,
                                save_total_limit=None if args.keep_checkpoints else 2))
    save_policy(run, model, tok, cfg)
    summary = {"command": "python benchmarks/bc_options.py " + " ".join(
        f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in vars(args).items()
        if v is not None and v is not False and k not in ("compare", "score", "against", "export_curve", "split", "episodes", "decoding", "label_mix", "prompt_tokens")),
        "examples": len(examples), "option_examples": len(options), "mixed_examples": len(mixed),
        "train_loss": stats.get("train_loss"), "epochs": stats.get("epochs"),
        "seconds": round(time.monotonic() - t0, 1)}
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))
    if args.keep_checkpoints:
        export_curve(run)


def label_mix(trajs: list[Trajectory]) -> dict[str, dict[str, int]]:
    """The cloned (oracle, valid) steps of ``trajs`` by "page: action kind" (the shop's ``page_type``), all of them
    and on-path only."""
    def kind(x: Transition) -> str:
        a = x.action
        for word in ("back to search", "next >", "< prev", "buy now"):
            if a == f"click[{word}]":
                return word
        if a.startswith("search["):
            return "search"
        return "option" if option_step(x.state, a, x.info.get("admissible_actions") or []) else "click"

    counts: dict[str, Counter[str]] = {"all": Counter(), "on_path": Counter()}
    for traj in trajs:
        cut = len(on_path(traj).transitions)
        for i, x in enumerate(traj.transitions):
            if x.info.get("invalid_action") or x.info.get("detour"):
                continue
            label = f"{page_type(x.state)}: {kind(x)}"
            counts["all"][label] += 1
            counts["on_path"][label] += i < cut
    return {k: dict(c.most_common()) for k, c in counts.items()}


def export_curve(run: Path) -> list[Path]:
    """Each checkpoint ``run/model/checkpoints/checkpoint-N`` as a policy run dir ``run/curve/step-N`` (its
    weights, the run's tokenizer and policy format), for ``dreamgym eval`` or ``policy_diag.py``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dreamgym.agent.policy import PolicyConfig

    cfg = PolicyConfig.model_validate_json((run / "policy.json").read_text())
    tok = AutoTokenizer.from_pretrained(run / "model")
    out = []
    for ckpt in sorted((run / "model" / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])):
        dst = run / "curve" / f"step-{ckpt.name.split('-')[1]}"
        save_policy(dst, AutoModelForCausalLM.from_pretrained(ckpt), tok, cfg)
        out.append(dst)
    return out


def score(args: argparse.Namespace) -> None:
    """Each run of ``--score`` (one training seed each) on the same ``--split`` tasks, free and guided greedy: the
    success per run, over runs and tasks (a two-level bootstrap, :func:`dreamgym.stats.bootstrap_ci`), and the
    per-task difference to the scripted "search, first result, buy" plan (``policy_diag.ScriptedFirst``), the plan
    cloning learns first: a paired bootstrap and a sign test over (seed, task) pairs."""
    from dreamgym.agent.policy import load_policy
    from dreamgym.collect import episode_tasks, run_episode
    from dreamgym.envs import make
    from dreamgym.envs.pool import env_factory
    from dreamgym.rl.evaluate import run_eval_episodes
    from dreamgym.stats import bootstrap_ci, paired_bootstrap_ci, sign_test

    try:
        from policy_diag import ScriptedFirst  # type: ignore[import-not-found]
    except ImportError:  # pragma: no cover
        from benchmarks.policy_diag import ScriptedFirst

    env_kwargs = {"val_fraction": 0.1} if args.split == "val" else {}
    env = make("shop", **env_kwargs)
    tasks = episode_tasks(env, args.split, args.episodes, 0)
    plan = [float(run_episode(env, ScriptedFirst(False), t, seed=i, split=args.split).success)
            for i, t in enumerate(tasks)]
    result: dict[str, object] = {
        "command": f"python benchmarks/bc_options.py --score {' '.join(args.score)} --split {args.split} "
                   f"--episodes {args.episodes}", "first_buy": sum(plan) / len(plan), "random": 0.0}
    if args.against:
        result["command"] = f"{result['command']} --against {' '.join(args.against)}"

    def run_wins(run: str, decoding: str) -> list[float]:
        cache = Path(run) / f"score_{args.split}_{args.episodes}_{decoding}.json"  # per-task, reused if there
        if cache.is_file():
            return [float(w) for w in json.loads(cache.read_text())["wins"]]
        policy = load_policy(run)
        policy.cfg = policy.cfg.model_copy(update={"decoding": decoding})
        played = sorted(run_eval_episodes(policy, env_factory("shop", **env_kwargs), args.split, args.episodes,
                                          seed=0), key=lambda e: e.group_id)
        assert [e.task.task_id for e in played] == [t.task_id for t in tasks if t is not None]
        won = [float(e.success) for e in played]
        cache.write_text(json.dumps({"tasks": [e.task.task_id for e in played], "wins": won,
                                     "mean_reward": sum(e.env_return for e in played) / len(played)}))
        return won

    for decoding in ("free", "admissible"):
        wins = [run_wins(run, decoding) for run in args.score]
        flat = [w for ws in wins for w in ws]
        row: dict[str, object] = {"per_run": {r: sum(w) / len(w) for r, w in zip(args.score, wins, strict=True)},
                                  "success": bootstrap_ci(wins),
                                  "minus_first_buy": paired_bootstrap_ci(wins, [plan] * len(wins)),
                                  "sign_test_vs_first_buy": sign_test(flat, plan * len(wins))}
        if args.against:  # the i-th run of each recipe (the same training seed) on the same tasks
            other = [run_wins(run, decoding) for run in args.against]
            n = min(len(wins), len(other))
            row["minus_against"] = {"seeds": n, **paired_bootstrap_ci(wins[:n], other[:n]),
                                    "sign_test": sign_test([w for ws in wins[:n] for w in ws],
                                                           [w for ws in other[:n] for w in ws])}
        result[decoding] = row
        print(decoding, json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


def compare(args: argparse.Namespace) -> None:
    """Greedy episodes of two policy runs on the same tasks and seeds; the per-task success difference A - B with
    a paired bootstrap CI over tasks (one training seed each, so it carries the task sample's variance only)."""
    from dreamgym.agent.policy import load_policy
    from dreamgym.envs.pool import env_factory
    from dreamgym.rl.evaluate import run_eval_episodes
    from dreamgym.stats import bootstrap_ci, paired_bootstrap_ci, sign_test

    env_kwargs = {"val_fraction": 0.1} if args.split == "val" else {}
    wins: list[list[float]] = []
    for run in args.compare:
        policy = load_policy(run)
        if args.decoding:
            policy.cfg = policy.cfg.model_copy(update={"decoding": args.decoding})
        played = run_eval_episodes(policy, env_factory("shop", **env_kwargs), args.split, args.episodes, seed=0)
        wins.append([float(e.success) for e in played])
    a, b = args.compare
    result = {"command": f"python benchmarks/bc_options.py --compare {a} {b} --split {args.split} --episodes "
                         f"{args.episodes}" + (f" --decoding {args.decoding}" if args.decoding else ""),
              a: bootstrap_ci([wins[0]]), b: bootstrap_ci([wins[1]]),
              "a_minus_b": paired_bootstrap_ci([wins[0]], [wins[1]]), "sign_test": sign_test(wins[0], wins[1])}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
