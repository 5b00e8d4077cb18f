"""Scripted shop policies for offline data: ``oracle``, ``noisy`` (oracle + random steps) and ``random``.

The oracle reads the goal from the task (it is the oracle) and the page it is on from the env, but acts only
through ordinary action strings. It is reactive — each action depends on the current page only, plus the
queries it has already tried — so it recovers from the random detours the noisy policy takes.
"""

from __future__ import annotations

from typing import Any

from dreamgym.envs.base import RandomPolicy, ScriptedPolicy, TextEnv
from dreamgym.envs.policies import NoisyPolicy as BaseNoisyPolicy
from dreamgym.envs.policies import make_policy as make_env_policy
from dreamgym.envs.shop.reward import ShopGoal, satisfies
from dreamgym.types import Task


class OraclePolicy:
    """Search with the instruction (then the goal's keywords), scan up to ``scan_pages`` result pages for the target or an equivalent
    product (one that earns reward 1), open it, select the goal's options and buy. If no page shows one,
    search again by the target's title."""

    name = "oracle"

    def __init__(self, seed: int = 0, scan_pages: int = 2) -> None:
        self.seed = seed  # accepted for a uniform factory signature: the oracle is deterministic
        self.scan_pages = scan_pages
        self.queries: list[str] = []

    def reset(self, env: TextEnv, task: Task | None) -> None:
        from dreamgym.envs.shop.env import ShopEnv

        if not isinstance(env, ShopEnv) or task is None:
            raise TypeError("the shop oracle plays a ShopEnv task")
        self.env, self.goal = env, ShopGoal.from_dict(task.goal, task.task_id)
        self.instruction = task.instruction
        self.queries = []

    def _query_plan(self) -> list[str]:
        # First the instruction itself, as WebShop's human demonstrators often did (BM25 finds a matching
        # product in the top 5 for 96% of test tasks with it, vs 89% for the goal's keywords); then keywords;
        # then the target's title.
        plan = [" ".join(self.instruction.split()),
                " ".join([self.goal.category, *self.goal.attributes, *self.goal.options.values()])]
        if self.goal.asin is not None:
            plan.append(self.env.catalog.get(self.goal.asin).title)
        return plan

    def act(self, obs: str, info: dict[str, Any]) -> str:
        state, page, catalog = self.env.state, self.env.page, self.env.catalog
        if state.page == "search":
            plan = self._query_plan()
            query = plan[min(len(self.queries), len(plan) - 1)]
            self.queries.append(query)
            return f"search[{query}]"
        if state.page == "results":
            if state.query not in self.queries:  # a detour: not one of ours
                return "click[back to search]"
            shown = [(target, click.item) for target, click in page.clicks.items() if click.kind == "item"]
            matches = [t for t, i in shown if i is not None and satisfies(self.goal, catalog.products[i])]
            target = (self.goal.asin or "").lower()
            if matches:
                return f"click[{target if target in matches else matches[0]}]"
            if state.page_no < self.scan_pages and "next >" in page.clicks:
                return "click[next >]"
            return "click[back to search]"
        if state.page == "item":
            product = self.env.product
            if product is None or not satisfies(self.goal, product):
                return "click[< prev]"
            selected = dict(state.selected)
            for name, value in self.goal.options.items():
                if selected.get(name) != value:
                    return f"click[{value}]"
            return "click[buy now]"
        return "click[< prev]"  # description / features


class NoisyPolicy(BaseNoisyPolicy):
    """The oracle, except that at each step with probability ``noise`` it takes a uniformly random admissible
    action instead: a realistic mix of successes and failures for offline data."""

    def __init__(self, seed: int = 0, noise: float = 0.3, scan_pages: int = 2) -> None:
        super().__init__(OraclePolicy(seed=seed, scan_pages=scan_pages), noise=noise, seed=seed)


def make_policy(name: str, seed: int = 0, **kwargs: Any) -> ScriptedPolicy:
    """A shop policy by name; ``kwargs`` go to its constructor (e.g. ``noise=0.3`` for ``noisy``)."""
    return make_env_policy("shop", {"oracle": OraclePolicy, "noisy": NoisyPolicy, "random": RandomPolicy}, name, seed,
                           **kwargs)
