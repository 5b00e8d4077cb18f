"""Run scripted policies in an environment: collect offline trajectories and score policies.

This is the plain single-episode loop (reset, act, step until done) that offline data collection and
the scripted-policy evaluation share. Batched LLM rollouts live in ``dreamgym.rl.rollout``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dreamgym.envs.base import ScriptedPolicy, TextEnv
from dreamgym.types import Source, Task, Trajectory, Transition


def run_episode(
    env: TextEnv,
    policy: ScriptedPolicy,
    task: Task | None = None,
    seed: int | None = None,
    split: str = "train",
    source: Source = "real",
) -> Trajectory:
    """Play one episode of ``task`` and return it as a :class:`Trajectory`."""
    obs, info = env.reset(seed=seed, options={"task": task, "split": split})
    task = info["task"]
    assert task is not None, "env.reset() must set info['task']"
    policy.reset(env, task)
    transitions: list[Transition] = []
    success = False
    invalid = 0
    while True:
        action = policy.act(obs, info)
        admissible = list(info.get("admissible_actions") or [])  # of ``obs``: what an agent saw when acting
        next_obs, reward, terminated, truncated, info = env.step(action)
        invalid += int(bool(info.get("invalid_action")))
        done = terminated or truncated
        step_info: dict[str, Any] = {"invalid_action": bool(info.get("invalid_action")), "admissible_actions": admissible}
        if truncated:
            step_info["truncated"] = True
        if "url" in info:  # where the step led (a browser env's page): its explainer reads the page's state there
            step_info["url"] = info["url"]
        if getattr(policy, "last_detour", False):  # a noisy policy's random step, not its oracle's choice
            step_info["detour"] = True
        transitions.append(
            Transition(state=obs, action=action, next_state=next_obs, reward=reward, done=done, info=step_info)
        )
        obs = next_obs
        if done:
            success = bool(info.get("success"))
            break
    recorder = getattr(env, "trajectory_meta", None)  # what an env adds to its records (the browser's site config)
    extra_meta: dict[str, Any] = recorder() if callable(recorder) else {}
    return Trajectory(
        task=task,
        transitions=transitions,
        success=success,
        source=source,
        policy=policy.name,
        meta={"env": env.name, "env_kwargs": env.make_kwargs, "seed": seed, "split": split, "invalid_actions": invalid,
              **extra_meta},
    )


def seeded_order(pool: list[Task], episodes: int, seed: int) -> list[Task]:
    """``episodes`` tasks of ``pool`` in a seeded order, cycling if needed (shared by every evaluation, so the
    scripted and the LLM policies play the same tasks)."""
    import random

    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    return [pool[order[i % len(order)]] for i in range(episodes)]


def episode_tasks(env: TextEnv, split: str, episodes: int, seed: int) -> list[Task | None]:
    """The tasks of ``episodes`` episodes: the split's tasks in a seeded order (None for envs without tasks)."""
    pool = env.tasks(split)
    return list(seeded_order(pool, episodes, seed)) if pool else [None] * episodes


def iter_episodes(
    env: TextEnv,
    policy: ScriptedPolicy,
    episodes: int,
    split: str = "train",
    seed: int = 0,
    skip: int = 0,
) -> Iterator[Trajectory]:
    """Yield ``episodes`` trajectories; episode ``i`` uses seed ``seed + i`` (so ``skip`` resumes exactly)."""
    tasks = episode_tasks(env, split, episodes, seed)
    for i in range(skip, episodes):
        yield run_episode(env, policy, tasks[i], seed=seed + i, split=split)


@dataclass
class EvalResult:
    episodes: int
    success_rate: float
    mean_reward: float
    mean_steps: float
    invalid_action_rate: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "episodes": self.episodes,
            "success_rate": self.success_rate,
            "mean_reward": self.mean_reward,
            "mean_steps": self.mean_steps,
            "invalid_action_rate": self.invalid_action_rate,
        }


def summarize(trajs: list[Trajectory]) -> EvalResult:
    n = len(trajs)
    if n == 0:
        return EvalResult(0, 0.0, 0.0, 0.0, 0.0)
    steps = sum(t.num_steps for t in trajs)
    invalid = sum(sum(bool(x.info.get("invalid_action")) for x in t.transitions) for t in trajs)
    return EvalResult(
        episodes=n,
        success_rate=sum(t.success for t in trajs) / n,
        mean_reward=sum(t.total_reward for t in trajs) / n,
        mean_steps=steps / n,
        invalid_action_rate=invalid / max(steps, 1),
    )


def per_task_results(trajs: list[Trajectory]) -> list[dict[str, Any]]:
    """One row per evaluation episode, in episode order: ``episode``, ``task_id``, ``success``, ``reward`` (the
    episode's total env reward). Evaluations on the same split, episodes and seed play the same tasks in the same
    order, so two policies' lists pair up index by index (the bench's paired comparisons)."""
    return [{"episode": i, "task_id": t.task.task_id, "success": bool(t.success), "reward": float(t.total_reward)}
            for i, t in enumerate(trajs)]


def evaluate_scripted(
    env: TextEnv,
    policy: ScriptedPolicy,
    episodes: int,
    split: str = "test",
    seed: int = 0,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> EvalResult:
    trajs = []
    for t in iter_episodes(env, policy, episodes, split=split, seed=seed):
        trajs.append(t)
        if on_episode:
            on_episode(t)
    return summarize(trajs)
