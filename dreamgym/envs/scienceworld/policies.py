"""Scripted ScienceWorld policies for offline data: ``oracle``, ``noisy`` and ``random``.

The oracle replays ScienceWorld's gold path (``get_gold_action_sequence``). A gold path is an open-loop
plan, and ScienceWorld offers no planner to re-plan from an arbitrary state, so the noisy variant only takes
detours the oracle can undo: with probability ``noise`` it plays a random *harmless* menu action — ``look
around``, ``inventory``, ``look at/in X`` (no effect on the world) or ``go to X`` (which the oracle undoes
next step by going back to the room it left; the door it came through is open). Everything else (pick up,
focus, move, …) could derail the plan, so it is never a noise step. ``benchmarks/bench_text_envs.py`` and
the report measure the resulting success.
"""

from __future__ import annotations

from typing import Any

from dreamgym.envs.base import RandomPolicy, ScriptedPolicy, TextEnv
from dreamgym.envs.policies import NoisyPolicy as BaseNoisyPolicy
from dreamgym.envs.policies import make_policy as make_env_policy
from dreamgym.types import Task

HARMLESS_PREFIXES = ("look around", "inventory", "look at ", "look in ", "go to ")


class OraclePolicy:
    """The gold path, one action per step (``look around`` once it is exhausted)."""

    name = "oracle"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed  # accepted for a uniform factory signature: the oracle is deterministic
        self.plan: list[str] = []
        self.position = 0
        self.return_to: str | None = None  # the room to go back to after a noisy "go to" detour

    def reset(self, env: TextEnv, task: Task | None) -> None:
        from dreamgym.envs.scienceworld.env import ScienceWorldEnv

        if not isinstance(env, ScienceWorldEnv):
            raise TypeError("the ScienceWorld oracle plays a ScienceWorldEnv")
        self.plan, self.position, self.return_to = env.gold_action_sequence(), 0, None

    def act(self, obs: str, info: dict[str, Any]) -> str:
        if self.return_to is not None and info.get("location") != self.return_to:
            return f"go to {self.return_to}"
        self.return_to = None
        if self.position >= len(self.plan):
            return "look around"
        self.position += 1
        return self.plan[self.position - 1]


class NoisyPolicy(BaseNoisyPolicy):
    """The oracle with probability ``1 - noise``, else a random harmless detour it can recover from."""

    oracle: OraclePolicy

    def __init__(self, seed: int = 0, noise: float = 0.3) -> None:
        super().__init__(OraclePolicy(seed=seed), noise=noise, seed=seed)

    def detours(self, info: dict[str, Any]) -> list[str]:
        if self.oracle.return_to is not None:  # still undoing the last detour
            return []
        harmless = [a for a in info.get("admissible_actions") or [] if a.startswith(HARMLESS_PREFIXES)]
        if "location" not in info:  # a detour through a door can only be undone from a known room
            harmless = [a for a in harmless if not a.startswith("go to ")]
        return harmless

    def take_detour(self, action: str, info: dict[str, Any]) -> str:
        if action.startswith("go to "):
            self.oracle.return_to = str(info.get("location"))
        return action


def make_policy(name: str, seed: int = 0, **kwargs: Any) -> ScriptedPolicy:
    """A ScienceWorld policy by name; ``kwargs`` go to its constructor (``noise=0.3`` for ``noisy``)."""
    return make_env_policy("scienceworld", {"oracle": OraclePolicy, "noisy": NoisyPolicy, "random": RandomPolicy},
                           name, seed, **kwargs)
