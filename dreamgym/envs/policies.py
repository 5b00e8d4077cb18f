"""Scripted policies shared by every env: the noisy oracle and the by-name factory behind ``scripted_policy``.

Each env brings its own oracle (it knows how to solve its tasks); :class:`NoisyPolicy` turns any oracle into
the offline-data policy of the paper's setting (mostly right, with random detours), and :func:`make_policy`
builds an env's policies by name with one error message for unknown names and bad arguments.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from dreamgym.envs.base import ScriptedPolicy, TextEnv
from dreamgym.types import Task


class NoisyPolicy:
    """An oracle, except that with probability ``noise`` a step is a uniformly random action among
    :meth:`detours` (by default every admissible action): a realistic mix of successes and failures."""

    name = "noisy"

    def __init__(self, oracle: Any, noise: float = 0.3, seed: int = 0) -> None:
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {noise}")
        self.noise = noise
        self.rng = random.Random(seed)
        self.oracle = oracle
        # whether the last action was a random detour rather than the oracle's: collection records it
        # (``info["detour"]``) so behaviour cloning can learn the oracle's actions only (DART-style noise injection:
        # the detours put the expert in states it would not reach alone, its recoveries are the labels)
        self.last_detour = False

    def reset(self, env: TextEnv, task: Task | None) -> None:
        self.oracle.reset(env, task)

    def detours(self, info: dict[str, Any]) -> list[str]:
        """The actions a noise step may take (subclasses restrict them to ones the oracle recovers from)."""
        return list(info.get("admissible_actions") or [])

    def act(self, obs: str, info: dict[str, Any]) -> str:
        actions = self.detours(info)
        self.last_detour = bool(actions) and self.rng.random() < self.noise
        if self.last_detour:
            return self.take_detour(str(self.rng.choice(actions)), info)
        return str(self.oracle.act(obs, info))

    def take_detour(self, action: str, info: dict[str, Any]) -> str:
        """Hook for oracles that must remember a detour to undo it; returns the action to play."""
        return action


def make_policy(
    env_name: str, policies: Mapping[str, Callable[..., ScriptedPolicy]], name: str, seed: int = 0, **kwargs: Any
) -> ScriptedPolicy:
    """``policies[name](seed=seed, **kwargs)``, with a one-line error for an unknown name or bad arguments."""
    if name not in policies:
        raise ValueError(f"{env_name} has no scripted policy {name!r} (has: {', '.join(policies)})")
    try:
        return policies[name](seed=seed, **kwargs)
    except TypeError as e:
        raise ValueError(f"bad arguments for {env_name} policy {name!r}: {e}") from None
