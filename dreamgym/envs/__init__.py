"""Environments: the text-env protocol, the registry, and the built-in envs."""

from dreamgym.envs.base import (
    Element,
    RandomPolicy,
    ScriptedPolicy,
    StateMapper,
    TextEnv,
    format_elements,
    make,
    register,
    registered,
)

# Built-in environments are registered lazily: importing dreamgym does not import their code.
register("shop", "dreamgym.envs.shop.env:ShopEnv")
register("agentgym", "dreamgym.envs.agentgym:AgentGymEnv")
register("scienceworld", "dreamgym.envs.scienceworld.env:ScienceWorldEnv")  # needs dreamgym[scienceworld] + Java
register("textworld", "dreamgym.envs.textworld.env:TextWorldEnv")  # needs dreamgym[textworld]

__all__ = [
    "Element",
    "RandomPolicy",
    "ScriptedPolicy",
    "StateMapper",
    "TextEnv",
    "format_elements",
    "make",
    "register",
    "registered",
]
