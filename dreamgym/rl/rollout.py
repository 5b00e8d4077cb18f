"""Multi-turn rollouts: G episodes per task, many tasks, one batched policy call per turn.

``collect_rollouts`` plays ``len(tasks) × group_size`` episodes on an :class:`~dreamgym.envs.pool.EnvPool`.
Every turn it makes ONE ``policy.act`` call over all live episodes, then steps their envs as a batch. When
there are more episodes than env slots, a finished episode's slot takes the next waiting episode
(continuous batching), so the pool size bounds memory, not correctness.

What a turn keeps, for RL (token-in/token-out: nothing is re-tokenised between acting and training):

* ``prompt_ids``: the agent prompt (task, step count, recent actions, the env's current state, admissible
  actions) exactly as the policy saw it. It is context: never trained on.
* ``response_ids`` and their behaviour ``logprobs``: the policy's own tokens, the only trained ones
  (loss mask = 1 on exactly these).
* ``reward``: the env reward minus the invalid-action penalty when the env flagged the action invalid, and
  minus ``no_effect_penalty`` when it flagged a valid action that changed nothing (``info["no_effect"]``)
  (``env_reward`` keeps the env's own number; trajectories written to files carry that one). With
  ``RLConfig.reward="success"`` the trainer swaps the env reward for the outcome (:meth:`Episode.use_outcome_reward`).

Seeds: the episodes of task ``k`` (one GRPO group) all reset their envs with seed ``seed + k``, so the G
episodes of a group start from the same initial state and differ only by the policy's samples (the group's
baseline then compares actions, not env draws); with ``group_size=1`` episode ``e`` is reset with ``seed + e``, so
a greedy evaluation plays the same episodes as the scripted ``dreamgym eval``. The c-th ``policy.act`` call
samples with a seed drawn from ``numpy.random.default_rng(seed)``; the same ``seed`` and weights give the same
episodes.

An episode cut by the step limit (or by the env's own truncation) at a non-terminal state keeps that state as
``Episode.final_obs``, so that PPO can bootstrap its last value target with the critic's V(s_T)
(``RLConfig.bootstrap_truncated``, :func:`dreamgym.rl.critic.truncated_values`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dreamgym.agent.policy import AgentObservation, LLMPolicy
from dreamgym.envs.pool import EnvPool
from dreamgym.types import Source, Task, Trajectory, Transition

# Seeds handed to the sampler stay below this, so that ``seed + row`` fits every generator.
MAX_SEED = 2**62


@dataclass
class Turn:
    """One policy response and the env step it caused."""

    state: str  # the observation acted in
    admissible: list[str]  # the admissible actions shown with it
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None  # behaviour log-probs, one per response id (None for greedy acting)
    text: str
    action: str  # "" when nothing parsable was generated (the env then flags the step invalid)
    parsed: bool
    next_state: str
    env_reward: float
    reward: float  # env_reward (or the outcome, Episode.use_outcome_reward) − the step's penalties: what RL optimises
    terminated: bool
    truncated: bool  # by the env or by the rollout's max_steps
    info: dict[str, Any]  # the env's info essentials after the step (its admissible actions dropped)
    weight_version: int | None = None  # the served weights that generated the response (rollout servers)
    allowed_ids: list[list[int]] | None = None  # action masking: per response token, the ids it was sampled among

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def invalid(self) -> bool:
        return bool(self.info.get("invalid_action"))

    @property
    def no_effect(self) -> bool:
        return bool(self.info.get("no_effect"))


@dataclass
class Episode:
    task: Task
    group_id: int  # index of the task in the rollout's task list: one GRPO group per task
    seed: int  # the env reset seed (shared by the episodes of a group)
    source: Source
    turns: list[Turn] = field(default_factory=list)
    success: bool = False
    final_obs: AgentObservation | None = None  # the non-terminal state a truncated episode was cut at
    outcome_reward: bool = False  # set by use_outcome_reward: the task's reward is the outcome, not env_reward

    @property
    def env_steps(self) -> int:
        """Real env transitions this episode consumed (one ``env.step`` per turn)."""
        return len(self.turns)

    @property
    def env_return(self) -> float:
        return float(sum(t.env_reward for t in self.turns))

    @property
    def shaped_return(self) -> float:
        """The return RL optimises: env rewards minus the steps' penalties (invalid action, no effect)."""
        return float(sum(t.reward for t in self.turns))

    @property
    def done(self) -> bool:
        return bool(self.turns) and self.turns[-1].done

    def task_rewards(self) -> list[float]:
        """Per turn, the task's reward before invalid-action penalties: ``env_reward``, or after
        :meth:`use_outcome_reward` the outcome (1 on the final step of a successful episode, else 0)."""
        if not self.outcome_reward:
            return [t.env_reward for t in self.turns]
        last = len(self.turns) - 1
        return [float(self.success and t.terminated and i == last) for i, t in enumerate(self.turns)]

    def use_outcome_reward(self) -> None:
        """RL optimises the paper's outcome reward instead of the env's (``RLConfig.reward="success"``): each
        turn's ``reward`` becomes its :meth:`task_rewards` entry minus its invalid-action penalty, if any.
        ``env_reward`` keeps the env's own number (the shop's graded score), and so do written trajectories."""
        penalties = [task_reward - t.reward for t, task_reward in zip(self.turns, self.task_rewards(), strict=True)]
        self.outcome_reward = True  # a second call finds the same penalties and changes nothing
        for turn, task_reward, penalty in zip(self.turns, self.task_rewards(), penalties, strict=True):
            turn.reward = task_reward - penalty

    def to_trajectory(self, policy_name: str = "llm", env_name: str | None = None) -> Trajectory:
        """The episode as a :class:`Trajectory` (env rewards; penalties and token ids left out)."""
        transitions = []
        for t in self.turns:
            info: dict[str, Any] = {"invalid_action": t.invalid, "parsed": t.parsed, "admissible_actions": t.admissible}
            if t.truncated:
                info["truncated"] = True
            # the dream's word on how it answered the step: recalled from the offline data, or its failure state
            info |= {k: t.info[k] for k in ("recalled", "dream_failure") if t.info.get(k)}
            transitions.append(
                Transition(state=t.state, action=t.action, next_state=t.next_state, reward=t.env_reward,
                           done=t.done, info=info)
            )
        return Trajectory(
            task=self.task,
            transitions=transitions,
            success=self.success,
            source=self.source,
            policy=policy_name,
            meta={"env": env_name or self.task.env, "seed": self.seed, "group_id": self.group_id,
                  "invalid_actions": sum(t.invalid for t in self.turns)},
        )


@dataclass
class RolloutStats:
    """Where a rollout's time went; accumulates over calls."""

    generation_s: float = 0.0
    env_s: float = 0.0
    policy_calls: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    env_steps: int = 0


@dataclass
class _Live:
    """An episode in progress on a pool slot."""

    episode: Episode
    obs: str
    admissible: list[str]
    history: list[tuple[str, str]] = field(default_factory=list)


def collect_rollouts(
    pool: EnvPool,
    policy: LLMPolicy,
    tasks: Sequence[Task],
    group_size: int = 1,
    max_steps: int = 15,
    greedy: bool = False,
    seed: int = 0,
    split: str = "train",
    invalid_action_penalty: float | None = None,
    no_effect_penalty: float = 0.0,
    stats: RolloutStats | None = None,
    on_env_steps: Callable[[int], None] | None = None,
) -> list[Episode]:
    """Play ``group_size`` episodes of every task; returns them task-major (task 0's G episodes first).

    ``invalid_action_penalty`` defaults to the policy's configured one; ``no_effect_penalty`` is subtracted from
    the reward of a valid step the env says changed nothing (``info["no_effect"]``). ``on_env_steps(n)`` is called
    before every batched env step with the number of ``env.step`` calls it will make (the trainer journals real
    ones).
    """
    if group_size < 1 or max_steps < 1:
        raise ValueError(f"group_size and max_steps must be >= 1, got {group_size} and {max_steps}")
    penalty = policy.cfg.invalid_action_penalty if invalid_action_penalty is None else invalid_action_penalty
    stats = stats if stats is not None else RolloutStats()
    sampler_seeds = np.random.default_rng(seed)
    episodes = [
        Episode(task=task, group_id=k, seed=seed + k, source=pool.source)  # one reset seed per group
        for k, task in enumerate(tasks)
        for g in range(group_size)
    ]
    waiting = deque(episodes)
    live: dict[int, _Live] = {}  # pool slot -> episode
    while waiting or live:
        # 1. fill free slots with waiting episodes
        free = [i for i in range(pool.num_envs) if i not in live][: len(waiting)]
        if free:
            starting = [waiting.popleft() for _ in free]
            t0 = time.perf_counter()
            resets = pool.reset_batch(free, [e.task for e in starting], [e.seed for e in starting], split)
            stats.env_s += time.perf_counter() - t0
            for slot, episode, (obs, info) in zip(free, starting, resets, strict=True):
                live[slot] = _Live(episode, obs, list(info.get("admissible_actions") or []))

        # 2. one batched policy call for every live episode
        slots = sorted(live)
        batch = [
            AgentObservation(live[i].episode.task.instruction, live[i].obs, live[i].admissible, live[i].history)
            for i in slots
        ]
        t0 = time.perf_counter()
        steps = policy.act(batch, greedy=greedy, seed=int(sampler_seeds.integers(MAX_SEED)))
        stats.generation_s += time.perf_counter() - t0
        stats.policy_calls += 1
        stats.generated_tokens += sum(len(s.response_ids) for s in steps)
        stats.prompt_tokens += sum(len(s.prompt_ids) for s in steps)

        # 3. step the envs (announced first: a kill inside the batch then counts it all, never less)
        if on_env_steps is not None:
            on_env_steps(len(slots))
        t0 = time.perf_counter()
        results = pool.step_batch(slots, [s.action for s in steps])
        stats.env_s += time.perf_counter() - t0
        stats.env_steps += len(slots)
        for slot, step, result in zip(slots, steps, results, strict=True):
            ep = live[slot]
            invalid = bool(result.info.get("invalid_action"))
            truncated = result.truncated or (not result.terminated and len(ep.episode.turns) + 1 >= max_steps)
            ep.episode.turns.append(
                Turn(
                    state=ep.obs,
                    admissible=ep.admissible,
                    prompt_ids=step.prompt_ids,
                    response_ids=step.response_ids,
                    logprobs=step.logprobs,
                    text=step.text,
                    action=step.action,
                    parsed=step.parsed,
                    next_state=result.obs,
                    env_reward=result.reward,
                    reward=(result.reward - (penalty if invalid else 0.0)
                            - (no_effect_penalty if result.info.get("no_effect") else 0.0)),
                    terminated=result.terminated,
                    truncated=truncated,
                    info={k: v for k, v in result.info.items() if k != "admissible_actions"},
                    weight_version=step.weight_version,
                    allowed_ids=step.allowed_ids,
                )
            )
            if result.terminated or truncated:
                ep.episode.success = bool(result.info.get("success"))
                if not result.terminated:  # cut at a live state: what the policy would have seen next
                    ep.episode.final_obs = AgentObservation(
                        ep.episode.task.instruction, result.obs, list(result.info.get("admissible_actions") or []),
                        [*ep.history, (ep.obs, step.action)])
                del live[slot]
            else:
                ep.history.append((ep.obs, step.action))
                ep.obs, ep.admissible = result.obs, list(result.info.get("admissible_actions") or [])
    return episodes


def count_env_steps(episodes: Sequence[Episode]) -> int:
    """The exact number of env transitions (``env.step`` calls) behind ``episodes``."""
    return sum(e.env_steps for e in episodes)


def episode_stats(episodes: Sequence[Episode]) -> list[tuple[float, float, bool, int, int, int]]:
    """What the trainer's metrics need of each episode (gathered from every rank): env return, shaped return,
    success, env steps, invalid turns, turns without effect."""
    return [(e.env_return, e.shaped_return, e.success, e.env_steps, sum(t.invalid for t in e.turns),
             sum(t.no_effect for t in e.turns)) for e in episodes]


__all__ = ["Episode", "RolloutStats", "Turn", "collect_rollouts", "count_env_steps", "episode_stats"]
