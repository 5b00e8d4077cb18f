"""Environments: the text-env protocol, the registry of :class:`EnvSpec`, env pools, and the built-in envs.

A new env is one small :class:`TextEnv` subclass plus one :func:`register` call (README, "Add an env"). A package
outside this repository registers its envs from a ``dreamgym.envs`` entry point, or is imported with the CLI's
``--import MODULE`` (:func:`load_plugins`).
"""

from dreamgym.envs.base import (
    SPLITS,
    Element,
    EnvSpec,
    RandomPolicy,
    ScriptedPolicy,
    StateMapper,
    TextEnv,
    check_split,
    find_spec,
    format_elements,
    make,
    page_type_of,
    parse_elements,
    register,
    registered,
    spec,
    truncate,
)
from dreamgym.envs.plugins import load_plugins
from dreamgym.envs.policies import NoisyPolicy, make_policy

# Built-in environments are registered lazily: importing dreamgym does not import their code.
register(
    "shop", "dreamgym.envs.shop.env:ShopEnv",
    policies="dreamgym.envs.shop.policies:make_policy",
    explainer="dreamgym.envs.shop.explain:explain_trajectory",
    consistency_checks="dreamgym.envs.shop.fidelity:check_steps",
    variation_operator="dreamgym.envs.shop.variations:ShopVariationOperator",
    page_type="dreamgym.envs.shop.pages:page_type",
    decision_step="dreamgym.envs.shop.pages:option_step",
    trace_checker="dreamgym.envs.shop.recheck:recheck_purchase",
    demo_defaults={
        "env_kwargs": {"num_products": 1000},
        # search[<instruction>] is a shop action; answer_by_name: option and button clicks cloned as text (on val,
        # seed 0: 0.295 success vs 0.165 all-numbers; benchmarks/pretrained_base.py, README)
        "policy": {"action_format": "index", "offer_task_search": True, "answer_by_name": True},
        "dream": {"task_generator": "rule", "synthetic_share": 0.25},
        # spend M_exp's budget on the pages a small model can learn to copy and check (item pages, purchases)
        # rather than on results pages, which only memorising the catalog would predict (configs/exp-shop-tiny.yaml)
        "exp_mixture": {"results": 0.15, "search": 0.3, "item": 1.0, "done": 2.0, "description": 0.5,
                        "features": 0.5},
        # M_exp also learns from 40% more episodes of the oracle at noise 0.8 (failed purchases, detours): at the same
        # 150 steps, ahead on every seed of 3 in done accuracy and next-state F1, on val and test
        # (benchmarks/results/exp_extra_behaviour.json, README); purchase rewards unchanged
        "extra_behaviour": [{"share": 0.4, "noise": 0.8}],
    },
)
register("agentgym", "dreamgym.envs.agentgym:AgentGymEnv")
# The dream as a registered env (make("dream", experience_model=..., offline_data=[...], env="shop")): a lazy
# reference, so the envs package imports nothing of the experience model's.
register("dream", "dreamgym.experience.dream:make_dream_env")
# needs dreamgym[browser] (Playwright) and a system Chromium; without start_url it serves the shop site itself
register("browser", "dreamgym.envs.web.env:BrowserEnv", policies="dreamgym.envs.web.policies:make_policy",
         explainer="dreamgym.envs.web.explain:explain_trajectory")
register(  # needs dreamgym[scienceworld] + Java
    "scienceworld", "dreamgym.envs.scienceworld.env:ScienceWorldEnv",
    policies="dreamgym.envs.scienceworld.policies:make_policy",
    explainer="dreamgym.envs.scienceworld.explain:explain_trajectory",
)
register(  # needs dreamgym[textworld]
    "textworld", "dreamgym.envs.textworld.env:TextWorldEnv",
    policies="dreamgym.envs.textworld.policies:make_policy",
    explainer="dreamgym.envs.textworld.explain:explain_trajectory",
    trace_premise="dreamgym.envs.textworld.explain:trace_premise",
    trace_checker="dreamgym.envs.textworld.recheck:recheck_step",
    decision_step="dreamgym.envs.textworld.state:take_step",
)

__all__ = [
    "SPLITS",
    "Element",
    "EnvSpec",
    "NoisyPolicy",
    "RandomPolicy",
    "ScriptedPolicy",
    "StateMapper",
    "TextEnv",
    "check_split",
    "find_spec",
    "format_elements",
    "load_plugins",
    "make",
    "make_policy",
    "page_type_of",
    "parse_elements",
    "register",
    "registered",
    "spec",
    "truncate",
]
