"""Scripted TextWorld policies for offline data: ``oracle``, ``noisy`` and ``random``.

The oracle follows TextWorld's own walkthrough, ``policy_commands`` — which the game recomputes from the
current state after every step — so the noisy variant recovers from its random detours for free (unless a
detour loses the game, e.g. eating the wrong item: a realistic failure).
"""

from __future__ import annotations

import logging
from typing import Any

from dreamgym.envs.base import RandomPolicy, ScriptedPolicy, TextEnv
from dreamgym.envs.policies import NoisyPolicy as BaseNoisyPolicy
from dreamgym.envs.policies import make_policy as make_env_policy
from dreamgym.types import Task

logger = logging.getLogger(__name__)


class OraclePolicy:
    """The first command of the game's current walkthrough (``look`` when the game has none, counted)."""

    name = "oracle"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed  # accepted for a uniform factory signature: the oracle is deterministic
        self.no_plan = 0  # steps where the game offered no walkthrough (an unwinnable state)

    def reset(self, env: TextEnv, task: Task | None) -> None:
        from dreamgym.envs.textworld.env import TextWorldEnv

        if not isinstance(env, TextWorldEnv):
            raise TypeError("the TextWorld oracle plays a TextWorldEnv")
        self.env = env

    def act(self, obs: str, info: dict[str, Any]) -> str:
        plan = self.env.policy_commands
        if not plan:
            self.no_plan += 1
            logger.debug("textworld oracle: no walkthrough from this state; playing 'look'")
            return "look"
        return plan[0]


class NoisyPolicy(BaseNoisyPolicy):
    """The oracle, except that with probability ``noise`` a step is a uniformly random admissible action."""

    def __init__(self, seed: int = 0, noise: float = 0.3) -> None:
        super().__init__(OraclePolicy(seed=seed), noise=noise, seed=seed)


def make_policy(name: str, seed: int = 0, **kwargs: Any) -> ScriptedPolicy:
    """A TextWorld policy by name; ``kwargs`` go to its constructor (``noise=0.3`` for ``noisy``)."""
    return make_env_policy("textworld", {"oracle": OraclePolicy, "noisy": NoisyPolicy, "random": RandomPolicy}, name,
                           seed, **kwargs)
