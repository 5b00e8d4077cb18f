"""Dream to real: teacher forcing scores single steps (:mod:`dreamgym.experience.fidelity`); a policy's dreamt
*episodes* are scored by replaying their actions in the real env from the same task and comparing how the two
episodes end (final reward, success). :func:`dream_rollouts` plays a policy in the dream on held-out tasks for
it; the trainer replays a dream run's last rollouts (``summary.json``'s ``wm2real``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from dreamgym.agent.policy import LLMPolicy
from dreamgym.envs import make
from dreamgym.envs.base import TextEnv
from dreamgym.experience.dream import DreamEnv, DreamEnvPool, InitialStates
from dreamgym.experience.fidelity import real_env_of
from dreamgym.experience.model import ExperienceModel
from dreamgym.rl.rollout import collect_rollouts
from dreamgym.types import Trajectory

log = logging.getLogger(__name__)


def wm2real(dreamt: Sequence[Trajectory], make_env: Callable[[], TextEnv], reward_tol: float = 0.1) -> dict[str, Any]:
    """Replay each dreamt episode's actions in the real env from the same task; how often the endings agree.

    The real env (``make_env()``, closed afterwards) is reset with the episode's task and its reset seed
    (``meta["seed"]``, when there is one) and steps the dreamt actions in order. An episode agrees on the
    reward when the dreamt and the real final reward (the last step's) are within ``reward_tol``, and on
    success when both succeeded or neither did. A replay that diverges is a disagreement on both, and stops:
    the real episode ended before the dreamt actions did (``real_ended_early``), the real env rejected an action
    the dream accepted (``invalid_in_real``) or accepted one the dream rejected (``rejected_in_dream``). An
    episode without steps, or whose task the real env cannot be reset to, is left out (``unreplayable``).
    Returns the rates (None when nothing was replayed), those counts and ``real_steps`` (real env steps taken).
    """
    if not dreamt:
        raise ValueError("wm2real: no dreamt episodes to replay")
    counts: Counter[str] = Counter()
    pairs: list[tuple[tuple[float, bool], tuple[float, bool], bool]] = []  # dreamt end, real end, diverged
    env = make_env()
    try:
        for traj in dreamt:
            seed = traj.meta.get("seed")
            try:
                if not traj.transitions:
                    raise ValueError("no steps")
                env.reset(seed=seed if isinstance(seed, int) else None, options={"task": traj.task})
            except (ValueError, KeyError) as e:
                counts["unreplayable"] += 1
                log.debug("wm2real: cannot replay %s: %s", traj.traj_id, e)
                continue
            real, diverged = (0.0, False), ""
            for i, x in enumerate(traj.transitions):
                _, reward, terminated, _, info = env.step(x.action)
                counts["real_steps"] += 1
                real = (float(reward), bool(info.get("success", False)))
                in_real, in_dream = bool(info.get("invalid_action")), bool(x.info.get("invalid_action"))
                if in_real != in_dream:
                    diverged = "invalid_in_real" if in_real else "rejected_in_dream"
                elif terminated and i < len(traj.transitions) - 1:
                    diverged = "real_ended_early"
                if diverged:
                    counts[diverged] += 1
                    break
            pairs.append(((traj.transitions[-1].reward, traj.success), real, bool(diverged)))
    finally:
        env.close()
    n = len(pairs)
    tol = reward_tol + 1e-9  # rewards are written with 2 decimals

    def rate(xs: Sequence[bool]) -> float | None:
        return sum(xs) / n if n else None

    return {
        "episodes": n,
        "reward_agreement": rate([not d and abs(a[0] - b[0]) <= tol for a, b, d in pairs]),
        "success_agreement": rate([not d and a[1] == b[1] for a, b, d in pairs]),
        "reward_tol": reward_tol,
        "dreamt_success_rate": rate([a[1] for a, _, _ in pairs]),
        "real_success_rate": rate([b[1] for _, b, _ in pairs]),
        "dreamt_mean_final_reward": sum(a[0] for a, _, _ in pairs) / n if n else None,
        "real_mean_final_reward": sum(b[0] for _, b, _ in pairs) / n if n else None,
        "diverged": sum(d for _, _, d in pairs),
        **{key: counts[key] for key in ("real_ended_early", "invalid_in_real", "rejected_in_dream", "unreplayable",
                                        "real_steps")},
    }


def dream_rollouts(
    model: ExperienceModel, policy: LLMPolicy, heldout: Sequence[Trajectory], episodes: int, seed: int = 0,
    max_steps: int = 15, num_envs: int = 16,
) -> list[Trajectory]:
    """Greedy episodes of ``policy`` in the dream of ``model`` on the tasks of the first ``episodes`` distinct
    held-out tasks, from their real initial states (the real env of the data as the action grammar; nothing is
    added to the model's buffer). Episode ``i`` is reset with seed ``seed + i`` (kept in ``meta["seed"]``)."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    env, kwargs = real_env_of(heldout)
    tasks = list({traj.task.task_id: traj.task for traj in heldout if traj.transitions}.values())[:episodes]
    grammar = make(env, **kwargs)
    initial = InitialStates.from_trajectories(heldout)
    pool = DreamEnvPool(lambda: DreamEnv(model, {"test": tasks}, initial, grammar=grammar, max_steps=max_steps),
                        min(num_envs, len(tasks)), add_to_buffer=False)
    try:
        played = collect_rollouts(pool, policy, tasks, group_size=1, max_steps=max_steps, greedy=True, seed=seed,
                                  split="test")
    finally:
        pool.close()
        grammar.close()
    return [e.to_trajectory(policy.name, env) for e in played]


def policy_wm2real(
    model: ExperienceModel, policy: LLMPolicy, heldout: Sequence[Trajectory], episodes: int = 50, seed: int = 0,
    max_steps: int = 15,
) -> dict[str, Any]:
    """:func:`wm2real` of ``policy``'s :func:`dream_rollouts` on ``episodes`` held-out tasks (``dreamgym eval-exp
    --policy``)."""
    dreamt = dream_rollouts(model, policy, heldout, episodes, seed, max_steps)
    env, kwargs = real_env_of(heldout)
    return wm2real(dreamt, lambda: make(env, **kwargs))


__all__ = ["dream_rollouts", "policy_wm2real", "wm2real"]
