"""Evaluate an LLM policy on an environment: success rate, mean reward, mean steps, invalid-action rate.

The numbers and JSON fields are those of :func:`dreamgym.collect.summarize` (the scripted policies' eval),
computed on the same episodes: the split's tasks in the same seeded order and episode ``i`` reset with seed
``seed + i``, so ``dreamgym eval --policy oracle`` and ``--policy RUN_DIR`` are directly comparable.
Episodes run as batched rollouts (one policy call per turn across all live episodes), greedy by default.
:func:`record_evaluation` is the trainer's evaluation: the same episodes, their env steps counted apart from
training's, and the result recorded in its state.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dreamgym.agent.policy import LLMPolicy
from dreamgym.collect import EvalResult, per_task_results, seeded_order, summarize
from dreamgym.envs.pool import EnvFactory, EnvPool, LocalEnvPool
from dreamgym.rl.checkpoint import TrainState
from dreamgym.rl.config import RLConfig
from dreamgym.rl.distributed import Dist
from dreamgym.rl.rollout import Episode, collect_rollouts, count_env_steps
from dreamgym.types import Task, Trajectory

# RUN/eval_tasks.json: the latest (so, at the end, the final) evaluation's per-episode task_id, success, reward
EVAL_TASKS = "eval_tasks.json"
# RUN/eval_tasks_start.json: the initial policy's (eval_at_start), so that a run pairs with its own start task by task
EVAL_TASKS_START = "eval_tasks_start.json"

def eval_tasks(pool: EnvPool, split: str, episodes: int, seed: int) -> list[Task]:
    """The split's tasks in the seeded order of :func:`dreamgym.collect.seeded_order`."""
    tasks = pool.tasks(split)
    if not tasks:
        raise ValueError(f"env {pool.name!r} has no tasks in split {split!r} to evaluate on")
    return seeded_order(tasks, episodes, seed)


def run_eval_episodes(
    policy: LLMPolicy,
    env: EnvFactory | EnvPool,
    split: str = "test",
    episodes: int = 100,
    seed: int = 0,
    greedy: bool = True,
    max_steps: int = 15,
    num_envs: int = 64,
) -> list[Episode]:
    """Play the evaluation episodes; ``env`` is a pool, or a factory for a local pool of ``num_envs`` envs."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    pool = LocalEnvPool(env, min(num_envs, episodes)) if callable(env) else env  # a factory, else a pool
    try:
        tasks = eval_tasks(pool, split, episodes, seed)
        return collect_rollouts(pool, policy, tasks, group_size=1, max_steps=max_steps, greedy=greedy,
                                seed=seed, split=split)
    finally:
        if pool is not env:
            pool.close()


def evaluate_policy(
    policy: LLMPolicy,
    env: EnvFactory | EnvPool,
    split: str = "test",
    episodes: int = 100,
    seed: int = 0,
    greedy: bool = True,
    max_steps: int = 15,
    num_envs: int = 64,
) -> EvalResult:
    """Success rate, mean (env) reward, mean steps and invalid-action rate over ``episodes`` episodes."""
    played = run_eval_episodes(policy, env, split, episodes, seed, greedy, max_steps, num_envs)
    return summarize([e.to_trajectory(policy.name) for e in played])


def write_per_task(path: Path, trajs: list[Trajectory], **meta: object) -> None:
    """``path`` (JSON, written atomically): ``meta`` and ``per_task`` (:func:`dreamgym.collect.per_task_results`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps({**meta, "per_task": per_task_results(trajs)}, indent=1))
    os.replace(tmp, path)


def record_evaluation(policy: LLMPolicy, pool: EnvPool, cfg: RLConfig, state: TrainState,
                      per_task: Path | None = None, dist: Dist | None = None) -> EvalResult:
    """Greedy episodes on the eval split (same tasks every time); their env steps are counted apart. ``per_task``:
    also write each episode's task_id, success and reward there (the trainer: ``RUN/eval_tasks.json``, which thus
    holds the latest, i.e. the final, evaluation). ``dist`` (data-parallel): rank 0 evaluates, and every rank
    gets its result and the evaluation counters."""
    if dist is not None and dist.world_size > 1:
        result = record_evaluation(policy, pool, cfg, state, per_task) if dist.is_main else None
        result, state.evals, state.eval_transitions = dist.broadcast((result, state.evals, state.eval_transitions))
        assert result is not None
        return result
    episodes = run_eval_episodes(policy, pool, cfg.eval_split, cfg.eval_episodes, seed=cfg.seed,
                                 greedy=True, max_steps=cfg.max_steps)
    state.eval_transitions += count_env_steps(episodes)
    trajs = [e.to_trajectory(policy.name) for e in episodes]
    result = summarize(trajs)
    if per_task is not None:
        write_per_task(per_task, trajs, iteration=state.iteration, split=cfg.eval_split, seed=cfg.seed)
    state.evals.append({"iteration": state.iteration, "real_transitions": state.real_transitions,
                        **result.to_dict()})
    return result


__all__ = ["EVAL_TASKS", "EVAL_TASKS_START", "eval_tasks", "evaluate_policy", "record_evaluation", "run_eval_episodes", "write_per_task"]
