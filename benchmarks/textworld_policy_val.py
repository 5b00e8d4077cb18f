"""A TextWorld policy on val: success beside the random policy's, and whether it takes the recipe's ingredients.

    python benchmarks/textworld_policy_val.py --config CONFIG RUN [RUN ...] [--episodes 30] [--split val]
        [--env-arg num_val_games=100] [--baseline RUN [RUN ...]] [--out FILE.json]

Each RUN (a policy run dir, e.g. from ``benchmarks/sft_val.py --set env=textworld``) plays the config's val games
greedily (``dreamgym.rl.evaluate.run_eval_episodes``, seed 0), as the bench's SFT stage plays test. Beside success,
the skill a cooking game turns on: at the policy's first ``take`` step with two or more things to take, is what it
takes one of the recipe's ingredients (the instruction's ``ingredients:`` list)? Its trivial baseline is the same
rate for a uniformly random pick among those ``take`` commands (the expected share of ingredients among them),
so a policy that answers by position, not by the recipe, scores about the baseline. The random policy's success
on the same games is printed too. ``--split train`` plays the config's train games instead (what the clone saw:
a policy far better there than on val has learnt its games, not the recipe).

Beside them, whether the policy repeats a command the game refused (:func:`refusals`): the refused steps, how many it
answered with the same command, and each episode's ending (won, lost, a loop of one refused command cut at the step
limit, unfinished), with the random policy's on the same games as the baseline. With ``--baseline`` (one run per RUN,
e.g. each seed's SFT before a change), the RUNs' val success against theirs, paired on the same games: the mean
difference with its 95% CI (bootstrap over seeds, then games) and a sign test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dreamgym.collect import evaluate_scripted, summarize
from dreamgym.envs import make
from dreamgym.envs.base import TextEnv
from dreamgym.envs.textworld.state import take_step
from dreamgym.pipeline import demo_config
from dreamgym.stats import bootstrap_ci, paired_bootstrap_ci, sign_test
from dreamgym.types import Trajectory


def _is_ingredient(take: str, ingredients: str) -> bool:
    return take.removeprefix("take ").split(" from ")[0] in ingredients


def first_choice(trajs: list[Trajectory]) -> dict[str, Any]:
    """At each episode's first ``take`` step among two or more ``take`` commands: the share that took an ingredient,
    and the share a uniform random pick among those commands would (its expectation)."""
    took = chance = n = 0.0
    for t in trajs:
        ingredients = t.task.instruction.rpartition("ingredients:")[2]
        for x in t.transitions:
            admissible = x.info.get("admissible_actions", [])
            if take_step(x.state, x.action, admissible):  # TextWorld's decision step: a choice among 2+ takes
                takes = [a for a in admissible if a.startswith("take ")]
                took += _is_ingredient(x.action, ingredients)
                chance += sum(_is_ingredient(a, ingredients) for a in takes) / len(takes)
                n += 1
                break
    return {"episodes_with_a_choice": int(n), "took_ingredient": took / n if n else None,
            "random_pick_baseline": chance / n if n else None}


def refusals(env: TextEnv, trajs: list[Trajectory], loop: int = 3) -> dict[str, Any]:
    """Whether a policy repeats a command the game refused. Over the valid non-final steps: those that changed
    nothing but the feedback (``TextEnv.had_effect``; TextWorld's refused ``prepare meal``: "You still miss
    something."), the ``prepare meal`` ones apart, and how many of the refused steps the policy answered with the same
    command again. Greedy, a deterministic policy in an unchanged state writes the same command: the state after a
    refusal differs from the one before only in its feedback line, which the cloned oracle never saw. And each
    episode by its ending: ``won``, ``lost`` (the game ended it, e.g. an ingredient eaten), ``loop`` (cut at the step
    limit after repeating one refused command ``loop`` times or more) or ``unfinished``."""
    c = {"steps": 0, "no_effect": 0, "prepare_meal": 0, "prepare_meal_no_effect": 0, "no_effect_followed": 0,
         "repeated": 0}
    endings = {"won": 0, "lost": 0, "loop": 0, "unfinished": 0}
    for t in trajs:
        refused = [not x.done and not x.info.get("invalid_action") and env.had_effect(x.state, x.next_state) is False
                   for x in t.transitions]
        for i, x in enumerate(t.transitions):
            if x.done or x.info.get("invalid_action"):
                continue
            prepare = x.action == "prepare meal"
            c["steps"] += 1
            c["no_effect"] += refused[i]
            c["prepare_meal"] += prepare
            c["prepare_meal_no_effect"] += prepare and refused[i]
            if refused[i] and i + 1 < len(t.transitions):
                c["no_effect_followed"] += 1
                c["repeated"] += t.transitions[i + 1].action == x.action
        last = t.transitions[-1] if t.transitions else None
        tail = t.transitions[-loop:]
        looped = len(tail) == loop and len({x.action for x in tail}) == 1 and all(refused[-loop:-1])
        endings["won" if t.success else "lost" if last is not None and last.done and not last.info.get("truncated")
                else "loop" if looped else "unfinished"] += 1
    return {**c, "repeat_rate": c["repeated"] / c["no_effect_followed"] if c["no_effect_followed"] else None,
            "endings": endings}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument("--split", choices=("val", "train"), default="val", help="never test: settings are chosen here")
    ap.add_argument("--env-arg", dest="env_args", action="append", default=[], metavar="KEY=VALUE",
                    help="an env_kwargs entry (YAML value), e.g. num_val_games=100 (rl_val.py's val games); repeatable")
    ap.add_argument("--baseline", type=Path, nargs="+", default=[],
                    help="one policy run dir per RUN, in the same order (e.g. each seed's SFT of the config before a "
                         "change): each is played too, and the RUNs' success is compared with theirs on the same "
                         "games, paired (bootstrap over seeds and games, a sign test)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from dreamgym.agent.policy import load_policy
    from dreamgym.envs.pool import env_factory
    from dreamgym.rl.evaluate import run_eval_episodes

    try:
        cfg = demo_config("default", {"env": "textworld"}, args.config)
        for item in args.env_args:
            key, eq, text = item.partition("=")
            if not eq or not key:
                raise ValueError(f"--env-arg expects KEY=VALUE, got {item!r}")
            cfg.env_kwargs[key] = yaml.safe_load(text)
        if args.baseline and len(args.baseline) != len(args.runs):
            raise ValueError(f"--baseline takes one run per RUN: {len(args.runs)} runs, {len(args.baseline)} baselines")
        missing = [str(r) for r in [*args.runs, *args.baseline] if not (r / "summary.json").is_file()]
        if missing:
            raise ValueError(f"not a policy run dir: {', '.join(missing)}")
    except ValueError as e:
        print(f"textworld_policy_val.py: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    env = make("textworld", **cfg.env_kwargs)
    rand_trajs: list[Trajectory] = []
    rand = evaluate_scripted(env, env.scripted_policy("random", seed=0), episodes=args.episodes, split=args.split,
                             on_episode=rand_trajs.append)
    result: dict[str, Any] = {"command": "python benchmarks/textworld_policy_val.py " + " ".join(sys.argv[1:]),
                              "split": args.split, "episodes": args.episodes,
                              "random_policy_success": rand.success_rate,
                              "random_policy_refusals": refusals(env, rand_trajs), "runs": {}}
    per_task: dict[Path, list[float]] = {}
    for run in [*args.runs, *(b for b in args.baseline if b not in args.runs)]:
        policy = load_policy(run)
        played = run_eval_episodes(policy, env_factory("textworld", **cfg.env_kwargs), args.split, args.episodes,
                                   seed=0, max_steps=cfg.max_steps)
        trajs = [e.to_trajectory(policy.name) for e in played]
        per_task[run] = [float(t.success) for t in trajs]  # the same games in the same order for every run
        trained = json.loads((run / "summary.json").read_text())
        made = run / "sft_val.json"  # benchmarks/sft_val.py's record: its command and the config fields it used
        result["runs"][str(run)] = {**summarize(trajs).to_dict(), **first_choice(trajs),
                                    "refusals": refusals(env, trajs),
                                    "sft_steps": trained.get("steps"), "sft_examples": trained.get("examples"),
                                    "trained_by": json.loads(made.read_text()) if made.is_file() else None}
        r = result["runs"][str(run)]
        f, rf = r["refusals"], result["random_policy_refusals"]
        print(f"{run}: success {r['success_rate']:.3f} (random policy {rand.success_rate:.3f}); first take an "
              f"ingredient {r['took_ingredient']} (random pick {r['random_pick_baseline']}); {f['no_effect']} of "
              f"{f['steps']} valid steps changed nothing ({f['prepare_meal_no_effect']} refused prepares), the same "
              f"command again after {f['repeated']} of {f['no_effect_followed']} (random policy {rf['repeated']} of "
              f"{rf['no_effect_followed']}); endings {f['endings']}")
    env.close()
    if args.baseline:
        runs, bases = [per_task[r] for r in args.runs], [per_task[b] for b in args.baseline]
        test = sign_test([x for r in runs for x in r], [x for b in bases for x in b])
        result["against_baseline"] = {"pairs": [[str(r), str(b)] for r, b in zip(args.runs, args.baseline, strict=True)],
                                      "success": bootstrap_ci(runs), "baseline_success": bootstrap_ci(bases),
                                      "difference": paired_bootstrap_ci(runs, bases), "sign_test": test}
        c = result["against_baseline"]
        print(f"runs {c['success']['mean']:.3f} [{c['success']['ci_low']:.3f}, {c['success']['ci_high']:.3f}] against "
              f"baselines {c['baseline_success']['mean']:.3f}: {c['difference']['mean']:+.3f} "
              f"[{c['difference']['ci_low']:+.3f}, {c['difference']['ci_high']:+.3f}] (won {test['a_better']}, lost "
              f"{test['b_better']}, sign test p = {test['p']:.2g})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
