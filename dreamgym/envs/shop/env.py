"""``ShopEnv``: a WebShop-protocol (Yao et al. 2022) shopping environment over a synthetic catalog.

Actions are ``search[query]`` (on the search page only) and ``click[element]`` (case-insensitive: a product id,
an option value, or a button such as ``buy now``, ``next >``, ``< prev``, ``back to search``, ``description``,
``features``). Buying ends the episode with WebShop's graded reward (see :mod:`dreamgym.envs.shop.reward`);
every other step earns 0. ``info["admissible_actions"]`` lists the clicks of the current page; search is
free-form, so on the search page it lists a few example queries drawn from the episode's RNG (so a uniform
random policy can act) — any other query is valid too.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from dreamgym.envs.base import TextEnv
from dreamgym.envs.shop.catalog import Catalog, Product, build_catalog
from dreamgym.envs.shop.pages import (
    Click,
    Page,
    ShopState,
    ShopStateMapper,
    after_click,
    build_page,
    clicks_in_state,
)
from dreamgym.envs.shop.reward import ShopGoal, purchase_reward
from dreamgym.envs.shop.search import SearchEngine, search_engine
from dreamgym.envs.shop.tasks import build_tasks, split_targets
from dreamgym.envs.shop.vocab import CATEGORIES, CATEGORY_BY_NAME
from dreamgym.types import Task

ACTION_RE = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)


def parse_action(action: str) -> tuple[str, str] | None:
    """``"click[Buy Now]"`` -> ``("click", "buy now")``; ``None`` if malformed or the argument is empty."""
    match = ACTION_RE.match(action)
    if match is None:
        return None
    verb, arg = match.group(1).lower(), " ".join(match.group(2).split())
    return (verb, arg if verb == "search" else arg.lower()) if arg else None


class ShopEnv(TextEnv):
    name = "shop"

    def __init__(
        self,
        num_products: int = 1000,
        catalog_seed: int = 0,
        num_tasks_per_split: int = 2000,
        max_steps: int = 15,
        results_per_page: int = 5,
        max_results: int = 50,
        test_fraction: float = 0.2,
        search_examples: int = 3,
        val_fraction: float = 0.0,
        num_val_tasks: int = 500,
    ) -> None:
        super().__init__(max_steps=max_steps)
        for key, value in (("max_steps", max_steps), ("results_per_page", results_per_page), ("max_results", max_results)):
            if value < 1:
                raise ValueError(f"shop env: {key} must be >= 1, got {value}")
        if num_tasks_per_split < 1 or num_val_tasks < 1 or search_examples < 0:
            raise ValueError("shop env: num_tasks_per_split and num_val_tasks must be >= 1 and search_examples >= 0")
        split_targets(num_products, catalog_seed, test_fraction, val_fraction)  # bad fractions fail here, not later
        self.num_products, self.catalog_seed = num_products, catalog_seed
        self.num_tasks_per_split, self.test_fraction = num_tasks_per_split, test_fraction
        self.val_fraction, self.num_val_tasks = val_fraction, num_val_tasks
        self.results_per_page, self.max_results, self.search_examples = results_per_page, max_results, search_examples
        self.catalog: Catalog = build_catalog(num_products, catalog_seed)
        self.engine: SearchEngine = search_engine(num_products, catalog_seed)
        self.state_mapper = ShopStateMapper()
        self.goal: ShopGoal | None = None
        self.state = ShopState()
        self.page = Page("search")

    # -- tasks ------------------------------------------------------------------------------------
    def tasks(self, split: str = "train") -> list[Task]:
        """``num_tasks_per_split`` train or test tasks, or ``num_val_tasks`` val tasks (val needs ``val_fraction``
        > 0: the products it reserves as val targets leave train's; test's never change)."""
        num_tasks = self.num_val_tasks if split == "val" else self.num_tasks_per_split
        return list(build_tasks(self.num_products, self.catalog_seed, split, num_tasks, self.test_fraction,
                                self.val_fraction))

    # -- episode ----------------------------------------------------------------------------------
    def _reset(self, task: Task | None, split: str) -> tuple[str, dict[str, Any]]:
        if task is None:
            raise ValueError("shop env: reset needs a task (none given and the split has none)")
        goal = ShopGoal.from_dict(task.goal, task.task_id)
        if goal.category not in CATEGORY_BY_NAME:
            raise ValueError(f"shop task {task.task_id!r}: unknown category {goal.category!r}")
        self.task, self.goal = task, goal
        return self._move(self._search_state(), reward=0.0)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        parsed = parse_action(action)
        if parsed is None or self.state.page == "done":
            return self._invalid()
        verb, arg = parsed
        if verb == "search":
            if not self.page.searchable:
                return self._invalid()
            results = tuple(self.engine.search(arg, self.max_results))
            obs, info = self._move(ShopState("results", query=arg, results=results), reward=0.0)
            return obs, 0.0, False, info
        click = self.page.clicks.get(arg)
        if click is None:
            return self._invalid()
        if click.kind == "buy":
            return self._buy()
        obs, info = self._move(self._after_click(click), reward=0.0)
        return obs, 0.0, False, info

    def _after_click(self, click: Click) -> ShopState:
        if click.kind == "back_to_search":
            return self._search_state()
        return after_click(self.state, click)

    def _buy(self) -> tuple[str, float, bool, dict[str, Any]]:
        assert self.goal is not None and self.state.item is not None
        product = self.product
        assert product is not None
        breakdown = purchase_reward(self.goal, product, dict(self.state.selected))
        state = dataclasses.replace(self.state, page="done", score=breakdown.total)
        obs, info = self._move(state, reward=breakdown.total)
        info["success"] = breakdown.success
        info["purchase"] = {"asin": product.asin, "options": dict(self.state.selected), **breakdown.to_dict()}
        return obs, breakdown.total, True, info

    # -- helpers ----------------------------------------------------------------------------------
    @property
    def product(self) -> Product | None:
        """The product on the current item/description/features/done page."""
        return None if self.state.item is None else self.catalog.products[self.state.item]

    def _search_state(self) -> ShopState:
        """A fresh search page with example queries ("<attribute> <category>") from the episode RNG."""
        examples = []
        for _ in range(self.search_examples):
            spec = CATEGORIES[int(self.np_random.integers(len(CATEGORIES)))]
            attribute = spec.attributes[int(self.np_random.integers(len(spec.attributes)))]
            examples.append(f"{attribute} {spec.name}")
        return ShopState("search", examples=tuple(dict.fromkeys(examples)))

    def _move(self, state: ShopState, reward: float) -> tuple[str, dict[str, Any]]:
        self.state = state
        self.page = build_page(state, self.catalog, self.results_per_page)
        info = self._info(reward=reward, invalid=False)
        return self.state_mapper(self.page, info), info

    def _invalid(self) -> tuple[str, float, bool, dict[str, Any]]:
        """The state stays, reward 0, flagged (WebShop's invalid action)."""
        return self._last_obs, 0.0, False, self._info(reward=0.0, invalid=True)

    def _info(self, reward: float, invalid: bool) -> dict[str, Any]:
        actions = [] if self.state.page == "done" else self.page.admissible_actions()
        return {
            "admissible_actions": actions,
            "invalid_action": invalid,
            "reward": reward,
            "success": False,
            "page": self.state.page,
        }

    # -- action grammar of abstract states (for the dream env) ------------------------------------
    def admissible_for_state(self, state: str) -> list[str]:
        targets, searchable = clicks_in_state(state)
        examples = self._search_state().examples if searchable else ()
        return [f"search[{q}]" for q in examples] + [f"click[{t}]" for t in targets]

    def action_valid_for_state(self, state: str, action: str) -> bool:
        parsed = parse_action(action)
        if parsed is None:
            return False
        targets, searchable = clicks_in_state(state)
        return searchable if parsed[0] == "search" else parsed[1] in targets
