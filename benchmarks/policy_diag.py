"""Where a shop policy's greedy episodes go wrong: each episode's first failing phase.

    .venv/bin/python benchmarks/policy_diag.py RUN [RUN ...] --split val --episodes 200 [--out FILE.json]

Plays ``--episodes`` greedy episodes of ``--split`` (val: the shop with ``val_fraction=0.1``, the split the bench
chooses settings on) with each policy run dir, the same tasks and seed as ``benchmarks/pretrained_base.py``'s
evaluation, and sorts every episode by the first phase of the oracle's plan (search with the instruction, open a
product, select the task's options, buy) it misses:

* ``no_search``: no ``search[...]`` with the task's instruction before the first product opened;
* ``no_product``: never opened a product page;
* ``wrong_product``: the last product bought or opened is not one that satisfies the goal's type, attributes and
  price (:func:`dreamgym.envs.shop.reward.satisfies`);
* ``wrong_options``: bought a right product with an option missing or wrong;
* ``no_buy``: a right product with the right options, never bought (ran out of steps);
* ``success``.

Beside each policy it prints the same breakdown for three scripted references on the same tasks: ``random``,
``first_buy`` (search with the instruction, open the first result, buy) and ``first_opts_buy`` (the same, selecting
the options the instruction names before buying): what a policy that has learned the plan but not the comparisons
scores.

``--option-data FILE`` (trajectories, e.g. the val noisy-oracle episodes) adds, per policy, how often it ranks the
oracle's option first among an item page's options by the teacher-forced log-probability of each option's action
(the oracle's option steps with two or more options), beside picking at random: whether the policy can match an
option with the task's words at all, whatever greedy decoding then writes.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from dreamgym.types import Trajectory, read_trajectories

PHASES = ("no_search", "no_product", "wrong_product", "wrong_options", "no_buy", "success")


@functools.lru_cache(maxsize=2)
def products_by_id(catalog: Any) -> dict[str, Any]:
    return {p.asin.lower(): p for p in catalog.products}


def phase(traj: Trajectory, env: Any) -> str:
    """The first phase of the oracle's plan ``traj`` misses (see the module docstring)."""
    from dreamgym.envs.shop.reward import ShopGoal, satisfies

    if traj.success:
        return "success"
    goal = ShopGoal.from_dict(traj.task.goal, traj.task.task_id)
    instruction = " ".join(traj.task.instruction.split()).lower()
    actions = [x.action.lower() for x in traj.transitions]
    ids = products_by_id(env.catalog)
    opened = [a[6:-1] for a in actions if a.startswith("click[") and a[6:-1] in ids]
    first_open = next((i for i, a in enumerate(actions) if a.startswith("click[") and a[6:-1] in ids), len(actions))
    if f"search[{instruction}]" not in actions[:first_open]:
        return "no_search"
    if not opened:
        return "no_product"
    product = ids[opened[-1]]
    if not satisfies(goal, product):
        return "wrong_product"
    last = max(i for i, a in enumerate(actions) if a == f"click[{opened[-1]}]")
    chosen = {a[6:-1] for a in actions[last + 1:] if a.startswith("click[")}
    if not all(v.lower() in chosen for v in goal.options.values()):
        return "wrong_options"
    return "no_buy" if "click[buy now]" not in actions[last + 1:] else "wrong_options"


class ScriptedFirst:
    """Search with the instruction, open the first result, optionally select the options the instruction names
    (an option value that occurs in the instruction's text), buy."""

    def __init__(self, options: bool) -> None:
        self.options, self.name = options, "first_opts_buy" if options else "first_buy"

    def reset(self, env: Any, task: Any) -> None:
        self.instruction = " ".join(task.instruction.split())
        self.done: set[str] = set()

    def act(self, obs: str, info: dict[str, Any]) -> str:
        actions = list(info.get("admissible_actions") or [])
        if any(a.startswith("search[") for a in actions) or "search[" in obs:
            return f"search[{self.instruction}]"
        items = [a for a in actions if a.startswith("click[b0")]
        if "Buy Now" not in obs:
            return items[0] if items else "click[back to search]"
        if self.options:
            for a in actions:
                value = a[6:-1]
                if a not in self.done and "option:" in obs and f" {value}" in f" {self.instruction.lower()}" \
                        and f"={value}" in obs.lower() and value not in ("buy now", "< prev", "back to search"):
                    self.done.add(a)
                    return a
        return "click[buy now]"


def option_steps(trajs: list[Trajectory]) -> list[tuple[Any, str, list[str]]]:
    """``(AgentObservation, oracle action, the page's option actions)`` at each non-detour step where the oracle
    clicks one of two or more options (``click[v]`` for a ``name=v`` line of the state)."""
    from dreamgym.baselines.sft import agent_observations
    from dreamgym.envs.shop.pages import option_step

    steps = []
    for traj in trajs:
        for obs, x in zip(agent_observations(traj), traj.transitions, strict=True):
            if not x.info.get("detour") and option_step(obs.state, x.action, obs.admissible_actions):
                options = [a for a in obs.admissible_actions if option_step(obs.state, a, obs.admissible_actions)]
                steps.append((obs, x.action, options))
    return steps


def target_logprob(model: Any, prompt: list[int], target: list[int]) -> float:
    """Teacher-forced log-probability of the ``target`` ids after the ``prompt`` ids."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + target], device=model.device)).logits[0, len(prompt) - 1 : -1]
    return float(torch.log_softmax(logits.float().cpu(), -1).gather(1, torch.tensor(target)[:, None]).sum())


def option_ranking(policy: Any, trajs: list[Trajectory]) -> dict[str, float]:
    """Teacher-forced: how often the oracle's option scores highest among the page's option actions (each scored
    as the policy writes it: :func:`~dreamgym.agent.policy.action_target`)."""
    from dreamgym.agent.policy import action_target, build_agent_prompt
    from dreamgym.sft import encode_prompt, encode_target

    tok, model = policy.llm.tokenizer, policy.llm.model
    hits = steps = 0
    chance = option_mass = buy_mass = 0.0
    for obs, action, options in option_steps(trajs):
        prompt = encode_prompt(tok, build_agent_prompt(obs, policy.cfg))
        # each action as the policy writes it
        scores = [target_logprob(model, prompt, encode_target(tok, action_target(obs, a, policy.cfg)))
                  for a in [*options, "click[buy now]"]]
        buy = scores.pop()
        hits += options[max(range(len(options)), key=scores.__getitem__)] == action
        steps += 1
        chance += 1 / len(options)
        option_mass += sum(math.exp(v) for v in scores)
        buy_mass += math.exp(buy)
    # where the oracle clicks an option: the probability the policy gives any of the page's options, and buying
    return {"option_steps": steps, "ranked_first": hits / max(steps, 1), "random_pick": chance / max(steps, 1),
            "p_any_option": option_mass / max(steps, 1), "p_buy_now": buy_mass / max(steps, 1)}


def breakdown(trajs: list[Trajectory], env: Any) -> dict[str, Any]:
    counts = Counter(phase(t, env) for t in trajs)
    return {"episodes": len(trajs), "success": counts["success"] / len(trajs),
            "mean_reward": sum(t.total_reward for t in trajs) / len(trajs),
            "phases": {p: counts[p] for p in PHASES}}


def main() -> None:
    from dreamgym.agent.policy import load_policy
    from dreamgym.collect import episode_tasks, run_episode
    from dreamgym.envs import make
    from dreamgym.envs.base import RandomPolicy
    from dreamgym.envs.pool import env_factory
    from dreamgym.rl.evaluate import run_eval_episodes

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--split", choices=["val", "test"], default="val")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--option-data", type=Path, default=None, help="trajectories for the option ranking")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--show-stalls", type=int, default=0, metavar="N",
                        help="print the actions of each run's first N no_buy episodes (right options, never bought)")
    args = parser.parse_args()
    env_kwargs = {"val_fraction": 0.1} if args.split == "val" else {}
    env = make("shop", **env_kwargs)
    out: dict[str, Any] = {"command": "python benchmarks/policy_diag.py " + " ".join(
        [*map(str, args.runs), "--split", args.split, "--episodes", str(args.episodes),
         *(["--option-data", str(args.option_data)] if args.option_data else [])]), "rows": {}}
    tasks = episode_tasks(env, args.split, args.episodes, 0)
    for ref in (RandomPolicy(seed=0), ScriptedFirst(False), ScriptedFirst(True)):
        trajs = [run_episode(env, ref, t, seed=i, split=args.split) for i, t in enumerate(tasks)]
        out["rows"][ref.name] = breakdown(trajs, env)
        print(ref.name, json.dumps(out["rows"][ref.name]), flush=True)
    option_trajs = list(read_trajectories(args.option_data)) if args.option_data else []
    for run in args.runs:
        policy = load_policy(run)
        played = run_eval_episodes(policy, env_factory("shop", **env_kwargs), args.split, args.episodes,
                                   seed=0, greedy=True, max_steps=15, num_envs=64)
        trajs = [e.to_trajectory("llm") for e in played]
        out["rows"][str(run)] = breakdown(trajs, env)
        for t in [t for t in trajs if phase(t, env) == "no_buy"][: args.show_stalls]:
            print(f"{run} no_buy {t.task.task_id}:", [x.action for x in t.transitions], flush=True)
        if option_trajs:
            out["rows"][str(run)]["option_ranking"] = option_ranking(policy, option_trajs)
        print(run, json.dumps(out["rows"][str(run)]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
