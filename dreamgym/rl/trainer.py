"""The RL trainer: GRPO or PPO on multi-turn rollouts in any env (the real shop, an AgentGym server, the dream).

One loop, read top to bottom (CleanRL style). Each iteration:

1. collect_rollouts: sample ``tasks_per_iter`` tasks of the train split and play ``group_size`` episodes of
   each (:func:`~dreamgym.rl.rollout.collect_rollouts`); every ``env.step`` is counted in ``real_transitions``;
   in the dream the curriculum then adds variations of the high-variance tasks to the task set;
2. advantages, one per turn (:mod:`dreamgym.rl.batch`): GRPO = the episode's group-normalised return on every
   turn of the episode (``invalid_penalty_mode``: the invalid-action penalty in that return, or on the invalid
   turn's own advantage), plus with ``step_advantage_weight`` GiGPO's step term (the turn's return against the
   group's other turns from the same state); PPO = turn-level GAE(γ, λ) with the critic's V(s_t);
3. update: ``ppo_epochs`` passes over shuffled minibatches of turns (:class:`~dreamgym.rl.learner.Learner`);
4. evaluate greedily on the eval split every ``eval_every`` iterations (those episodes are counted apart and
   never trained on), log (tensorboard in ``RUN/tb``, ``RUN/metrics.jsonl``, one console line), and
5. checkpoint every ``save_every`` iterations (:mod:`dreamgym.rl.checkpoint`: weights, optimizers, critic, RNG
   states, counters, the task set; atomic).

The trainer never asks which pool it holds: the dream's replay buffer is tagged, checkpointed and reported
through the pool hooks (:class:`~dreamgym.envs.pool.PoolHooks`). ``RUN/summary.json`` holds
``real_transitions``, ``iterations`` and the last evaluation. With ``real_latency_s`` the real env of the
training rollouts costs that much per reset/step (:mod:`dreamgym.envs.latency`); every metrics line then has
the cumulative ``real_wait_s``, ``real_env_s`` and ``wall_s``. Envs are made by :func:`make_env_factory` only,
so sim-to-real is this trainer with a real env and a ``real_transition_budget``.

Data-parallel under ``accelerate launch`` (:mod:`dreamgym.rl.distributed`): every rank draws the same tasks and
rolls out its share of them; the counters, metrics and variances are gathered, so every rank holds the same
state; rank 0 alone evaluates, logs and checkpoints. One process (no launcher) runs exactly as before.

With ``rollout_server`` the training rollouts generate on a server whose log-probs are the behaviour log-probs;
it gets the weights after each update, and older weights' rollouts are refused (:mod:`dreamgym.rl.weight_sync`).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from dreamgym.agent.policy import load_policy, on_policy_config, save_policy
from dreamgym.curriculum import TaskSet, cluster_groups
from dreamgym.envs.pool import EnvPool
from dreamgym.rl.advantages import reward_variance
from dreamgym.rl.batch import grpo_advantages, ppo_advantages, turn_rows
from dreamgym.rl.checkpoint import (
    TASKS,
    RealStepJournal,
    TrainState,
    load_checkpoint,
    log_metrics,
    open_run,
    progress_line,
    resume_pool,
    save,
    truncate_metrics,
    write_summary,
)
from dreamgym.rl.config import RLConfig, make_env_factory, open_pools, tasks_within_budget
from dreamgym.rl.critic import truncated_values
from dreamgym.rl.distributed import Dist
from dreamgym.rl.evaluate import EVAL_TASKS, EVAL_TASKS_START, record_evaluation
from dreamgym.rl.learner import Learner
from dreamgym.rl.rollout import MAX_SEED, Episode, RolloutStats, collect_rollouts, episode_stats
from dreamgym.rl.weight_sync import WeightSync
from dreamgym.rl.wm2real import wm2real
from dreamgym.types import Task, write_jsonl

log = logging.getLogger(__name__)


def train(cfg: RLConfig, run_dir: str | Path, resume: bool = False, console: Console | None = None) -> dict[str, Any]:
    """Run (or resume) RL training into ``run_dir``; returns the summary written to ``RUN/summary.json``."""
    from torch.utils.tensorboard import SummaryWriter

    # ---- setup: the ranks, the run dir, the seeds, the learner, the counters, the pools and the task set
    dist = Dist.from_env(cfg.device)  # one process unless launched by accelerate with several
    console = (console or Console(stderr=True)) if dist.is_main else Console(stderr=True, quiet=True)
    if dist.world_size > 1 and cfg.dream is not None and cfg.dream.buffer is not None:
        raise ValueError(f"data-parallel dream runs need dream.buffer unset: all {dist.world_size} ranks would write it")
    run = Path(run_dir)
    ckpt, start = open_run(cfg, run, resume, console, dist.is_main)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)  # every trainer draw: task sampling, rollout seeds, minibatch order
    policy = load_policy(start, device=str(dist.device), dtype=cfg.dtype)
    policy.cfg = on_policy_config(policy.cfg, cfg.temperature, cfg.invalid_action_penalty, cfg.top_p,
                                  cfg.action_masking)
    learner = Learner(policy, cfg, resumed=ckpt is not None, dist=dist)
    state = load_checkpoint(ckpt, learner, rng) if ckpt else TrainState()
    journal, lost = RealStepJournal.open(run, state.iteration, dist)  # real steps a killed attempt took
    state.real_transitions += lost
    if ckpt is not None:
        console.print(f"resumed {run} at iteration {state.iteration} ({state.real_transitions} real transitions)"
                      + (f" with world_size {dist.world_size}; it was saved with world_size {state.world_size}"
                         if state.world_size != dist.world_size else ""))
    state.world_size = dist.world_size
    if lost:
        console.print(f"charged {lost} real transitions that a killed attempt took after that checkpoint")
    pool, eval_pool = open_pools(cfg)  # rollouts: the real env or the dream; evaluations: always the real env
    train_tasks = pool.tasks(cfg.train_split)
    if not train_tasks:
        raise ValueError(f"env {cfg.env!r} has no tasks in split {cfg.train_split!r}")
    # The task set: the env's tasks plus, in the dream, the curriculum's variations of high-variance tasks.
    taskset = TaskSet(train_tasks)
    if ckpt is not None and (ckpt / TASKS).exists():
        taskset = TaskSet.load(ckpt / TASKS)
    if ckpt is not None:
        resume_pool(pool, state)
    dream = cfg.dream is not None  # the curriculum runs in the dream only: a real env's task set stays fixed
    generator = cfg.curriculum.task_generator_for(cfg.env, cfg.env_kwargs, pool.task_generator_llm) if dream else None
    synthetic_share = cfg.curriculum.synthetic_share if dream else 0.0
    sync = WeightSync(policy, cfg.rollout_server, run / "sync", dist)  # rollouts in process, or on a synced server
    writer = SummaryWriter(log_dir=str(run / "tb"), purge_step=state.iteration + 1 if ckpt else None) if dist.is_main else None
    metrics_path = run / "metrics.jsonl"
    if dist.is_main:
        truncate_metrics(metrics_path, state.iteration)
    started = time.monotonic() - state.seconds
    episodes: list[Episode] = []  # the last iteration's rollouts (a dream run's summary replays them: wm2real)
    try:
        sync.push()  # a rollout server serves the trainer's weights (a resumed run's too) from the first rollout
        # ---- evaluate: the initial policy
        if ckpt is None and cfg.eval_at_start and eval_pool is not None:
            result = record_evaluation(policy, eval_pool, cfg, state, run / EVAL_TASKS, dist)
            if dist.is_main:  # kept apart from the later evaluations' (redone on a resume before iteration 1 is saved)
                shutil.copyfile(run / EVAL_TASKS, run / EVAL_TASKS_START)
            console.print(f"iter 0 | eval success {result.success_rate:.3f} reward {result.mean_reward:.3f}")
        while state.iteration < cfg.iterations:
            if cfg.real_transition_budget is not None and state.real_transitions >= cfg.real_transition_budget:
                console.print(f"real-transition budget reached ({state.real_transitions} >= {cfg.real_transition_budget})")
                break
            n_tasks = tasks_within_budget(cfg, state.real_transitions) if pool.source == "real" else cfg.tasks_per_iter
            if n_tasks == 0:  # only with strict_budget, i.e. with a real_transition_budget
                left = (cfg.real_transition_budget or 0) - state.real_transitions
                console.print(f"real-transition budget: {left} left, less "
                              f"than one group may take ({cfg.group_size} x {cfg.max_steps} steps); stopping")
                break

            # ---- collect_rollouts: G episodes of each sampled task (this rank's share), one policy call per turn
            state.iteration += 1
            it = state.iteration
            tasks = taskset.sample(n_tasks, random.Random(int(rng.integers(MAX_SEED))), synthetic_share)
            lo, hi = dist.shard(len(tasks))  # whole groups: task k resets with seed + k on any rank
            stats = RolloutStats()
            t0 = time.perf_counter()
            pool.on_iteration_start(it)  # the dream tags the synthetic transitions it writes to the replay buffer
            episodes = collect_rollouts(pool, sync.actor, tasks[lo:hi], cfg.group_size, cfg.max_steps, greedy=False,
                                        seed=int(rng.integers(MAX_SEED)) + lo, split=cfg.train_split, stats=stats,
                                        no_effect_penalty=cfg.no_effect_penalty,
                                        on_env_steps=journal.add if pool.source == "real" else None)
            rollout_s = time.perf_counter() - t0
            if cfg.reward == "success":
                for episode in episodes:
                    episode.use_outcome_reward()
            sync.check(episodes, it)  # the stale-policy guard: no turn generated under older weights than pushed
            ranks = dist.gather((episode_stats(episodes), stats.env_s,
                                 _group_variances(cfg, episodes, tasks[lo:hi], pool, it, generator is not None)))
            done = [e for r in ranks for e in r[0]]  # every rank's episodes: (return, shaped, success, steps, invalid, no effect)
            state.count_rollouts(sum(e[3] for e in done), len(done), pool.source, max(r[1] for r in ranks),
                                 cfg.real_latency_s)  # env steps and episodes summed over ranks
            # the curriculum: reward variance per group, then variations of the high-variance tasks join the set
            variances = {k: v for r in ranks for k, v in r[2].items()}
            if generator is not None:
                gen_rng = random.Random(int(rng.integers(MAX_SEED)))
                new_tasks = dist.broadcast(generator.step(variances, taskset, it, gen_rng) if dist.is_main else None)
                if not dist.is_main:  # rank 0's variations, so that every rank keeps the same task set
                    taskset.record_variances(variances)
                    taskset.add(new_tasks, it)
                state.synthetic_tasks += len(new_tasks)
            if cfg.save_rollouts:
                trajs = dist.gather([e.to_trajectory(policy.name) for e in episodes])
                if dist.is_main:
                    write_jsonl(run / "rollouts" / f"iter_{it:05d}.jsonl", [t for share in trajs for t in share])

            # ---- advantages: one per turn
            t0 = time.perf_counter()
            rows = turn_rows(episodes)
            step_stats: dict[str, float] = {}
            if learner.critic is not None:
                for row, v in zip(rows, learner.values(rows), strict=True):
                    row.old_value = v
                last = (truncated_values(learner.critic, policy, episodes, learner.pad_id, cfg.micro_batch_size)
                        if cfg.bootstrap_truncated else None)
                ppo_advantages(episodes, rows, cfg, last, dist)
            else:
                step_stats = grpo_advantages(episodes, rows, cfg.normalize_std, cfg.turn_weighting,
                                             cfg.invalid_penalty_mode, dist, cfg.step_advantage_weight, cfg.step_gamma)

            # ---- update: clipped policy (and value) steps on minibatches of turns (all-reduced across ranks)
            losses = learner.update(rows, rng)
            update_s = time.perf_counter() - t0
            losses.update(sync.push())  # a rollout server serves the new weights from the next rollout on

            # ---- evaluate, and log
            metrics: dict[str, Any] = {
                "iteration": it, "real_transitions": state.real_transitions,
                "reward": float(np.mean([e[0] for e in done])), "shaped_return": float(np.mean([e[1] for e in done])),
                "success": float(np.mean([e[2] for e in done])), "episode_steps": float(np.mean([e[3] for e in done])),
                "invalid_rate": sum(e[4] for e in done) / max(sum(e[3] for e in done), 1),
                "no_effect_rate": sum(e[5] for e in done) / max(sum(e[3] for e in done), 1),
                "synthetic_transitions": state.synthetic_transitions, "tasks": len(taskset),
                "tokens_per_s": stats.generated_tokens / max(stats.generation_s, 1e-9),
                "generation_s": stats.generation_s, "env_s": stats.env_s,
                "rollout_s": rollout_s, "update_s": update_s, **losses, **step_stats,
            }
            if variances:
                metrics["task_variances"] = sorted(variances.values())  # the curriculum's V per group
            if eval_pool is not None and ((cfg.eval_every and it % cfg.eval_every == 0) or it == cfg.iterations):
                result = record_evaluation(policy, eval_pool, cfg, state, run / EVAL_TASKS, dist)
                metrics.update({"eval_success": result.success_rate, "eval_reward": result.mean_reward})
            state.seconds = time.monotonic() - started  # this iteration's evaluation included; cumulative:
            metrics.update({"real_wait_s": state.real_wait_s, "real_env_s": state.real_env_s, "wall_s": state.seconds})
            if dist.is_main:
                log_metrics(writer, metrics_path, metrics)
            console.print(progress_line(metrics), highlight=False, soft_wrap=True)
            if rows and metrics["invalid_rate"] >= 1.0 and dist.is_main:
                log.warning("iteration %d: every action was invalid, so the update learns nothing; does the policy's "
                            "action_format (%s) match how it was trained?", it, policy.cfg.action_format)

            # ---- checkpoint (rank 0: the unwrapped model)
            if it % cfg.save_every == 0 or it == cfg.iterations:
                if dist.is_main:
                    save(run, learner, rng, state, taskset, pool)
                journal.committed(it)
        if not state.evals or state.evals[-1]["iteration"] != state.iteration:  # budget stop: a final evaluation
            if eval_pool is not None:
                record_evaluation(policy, eval_pool, cfg, state, run / EVAL_TASKS, dist)
            state.seconds = time.monotonic() - started
            if dist.is_main:
                save(run, learner, rng, state, taskset, pool)
            journal.committed(state.iteration)
    finally:
        if writer is not None:
            writer.close()
        pool.close()
        sync.close()
        if eval_pool is not None and eval_pool is not pool:
            eval_pool.close()
    if not dist.is_main:
        return dict(dist.broadcast(None))  # rank 0's summary
    llm: Any = policy.llm
    save_policy(run, llm.model, llm.tokenizer, policy.cfg)  # RUN is itself a policy run dir (eval --policy RUN)
    summary = write_summary(run, cfg, state)
    extra = pool.report()  # the dream: its experience model's call and parse counts
    if pool.source == "synthetic":
        # Dream to real: the last iteration's dreamt episodes replayed in the real env (its steps are not
        # counted in real_transitions: nothing is trained on them). None when no iteration ran in this call.
        dreamt = [e.to_trajectory(policy.name) for e in episodes]
        extra["wm2real"] = wm2real(dreamt, make_env_factory(cfg)) if dreamt else None
    if extra:
        summary.update(extra)
        (run / "summary.json").write_text(json.dumps(summary, indent=2))
    return dict(dist.broadcast(summary))


def _group_variances(cfg: RLConfig, episodes: Sequence[Episode], tasks: Sequence[Task], pool: EnvPool,
                     iteration: int, clustered: bool) -> dict[str, float]:
    """The curriculum's reward variance per group: GRPO's task groups (logged in every run); PPO has none, so
    with a task generator (``clustered``) tasks are clustered by φ (the pool's encoder, else the hashing one)."""
    from dreamgym.replay import HashingEncoder

    returns = torch.tensor([e.env_return for e in episodes], dtype=torch.float64)
    if cfg.algo == "grpo":
        return {str(k): v for k, v in reward_variance(returns, [e.task.task_id for e in episodes]).items()}
    if not clustered:
        return {}
    encoder = pool.encoder if pool.encoder is not None else HashingEncoder()
    clusters = cluster_groups(tasks, encoder, max(1, len(tasks) // 4), seed=iteration)
    by_cluster = reward_variance(returns, [clusters[e.task.task_id] for e in episodes])
    return {t.task_id: by_cluster[clusters[t.task_id]] for t in tasks}


__all__ = ["RLConfig", "TrainState", "make_env_factory", "tasks_within_budget", "train"]
