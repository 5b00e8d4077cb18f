"""Scripted TextWorld policies for offline data: ``oracle``, ``noisy``, ``hasty`` and ``random``.

The oracle follows TextWorld's own walkthrough, ``policy_commands`` — which the game recomputes from the
current state after every step — so the noisy variant recovers from its random detours for free (unless a
detour loses the game, e.g. eating the wrong item: a realistic failure). The hasty variant makes the mistake a
policy in training makes most (``prepare meal`` before every ingredient is carried), which the noisy oracle's
random detours almost never show: the game's refusal is what an experience model must learn for its dream to
refuse a meal too.
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


PREPARE = "prepare meal"


class HastyPolicy(NoisyPolicy):
    """The noisy oracle, which also prepares the meal too soon. Where ``prepare meal`` is admissible and the
    oracle would do something else, it prepares with probability ``early`` (the game answers ``You still miss
    something.`` and nothing changes), never twice in a row. Once an episode, at the oracle's last ``take``
    before preparing, with probability ``swap`` it takes another admissible item instead and prepares at once
    (as many items carried as the recipe needs, one of them wrong: refused too). The oracle then recovers. Both
    are detours (``last_detour``), so behaviour cloning never learns them."""

    name = "hasty"

    def __init__(self, seed: int = 0, noise: float = 0.3, early: float = 0.3, swap: float = 0.3) -> None:
        super().__init__(seed=seed, noise=noise)
        for what, p in (("early", early), ("swap", swap)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{what} must be in [0, 1], got {p}")
        self.early, self.swap = early, swap
        self.hasty_steps = 0  # steps played hastily (early prepares, swaps and their prepares)
        self.reset_episode()

    def reset_episode(self) -> None:
        self.prepare_next = False  # a swap was just made: prepare now
        self.prepared = False  # the last step was a hasty prepare
        self.swapped = False  # this episode's swap is spent

    def reset(self, env: TextEnv, task: Task | None) -> None:
        super().reset(env, task)
        self.reset_episode()

    def act(self, obs: str, info: dict[str, Any]) -> str:
        admissible = list(info.get("admissible_actions") or [])
        swapped, prepared = self.prepare_next, self.prepared
        self.prepare_next = self.prepared = False
        plan = self.oracle.env.policy_commands
        nxt = plan[0] if plan else None
        if PREPARE in admissible and nxt != PREPARE and (swapped or (not prepared and self.rng.random() < self.early)):
            self.prepared = True
            return self._hasty(PREPARE)
        if not self.swapped and PREPARE in admissible and nxt is not None and nxt.startswith("take ") \
                and _last_take(plan):
            others = sorted(a for a in admissible if a.startswith("take ") and a != nxt)
            if others and self.rng.random() < self.swap:
                self.prepare_next = self.swapped = True
                return self._hasty(self.rng.choice(others))
        return super().act(obs, info)

    def _hasty(self, action: str) -> str:
        self.last_detour = True
        self.hasty_steps += 1
        return action


def _last_take(plan: list[str]) -> bool:
    """Whether ``plan[0]`` is the walkthrough's last ``take`` before ``prepare meal``."""
    if PREPARE not in plan:
        return False
    return not any(a.startswith("take ") for a in plan[1:plan.index(PREPARE)])


def make_policy(name: str, seed: int = 0, **kwargs: Any) -> ScriptedPolicy:
    """A TextWorld policy by name; ``kwargs`` go to its constructor (``noise=0.3`` for ``noisy``; ``noise``,
    ``early`` and ``swap`` for ``hasty``)."""
    return make_env_policy("textworld", {"oracle": OraclePolicy, "noisy": NoisyPolicy, "hasty": HastyPolicy,
                                         "random": RandomPolicy}, name, seed, **kwargs)
