"""Rule-based task variations for the shop: the curriculum's default task generator on the tiny CPU setup.

A variation is written from the seed task's target product, so it stays feasible (that product satisfies
it) while becoming more specific or harder: add or swap an attribute the product has, add an option or
change its value among those the product offers, or tighten the price bound towards the product's price.
The paper's task generator is an LLM (``dreamgym.curriculum.LLMVariationOperator``); a 3M-parameter model
cannot write good tasks, so the CPU default uses these operators and the LLM one is a config switch.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import replace

from dreamgym.envs.shop.catalog import Catalog, Product, build_catalog
from dreamgym.envs.shop.reward import ShopGoal, satisfies
from dreamgym.envs.shop.tasks import TEMPLATES, write_instruction
from dreamgym.types import Task

MAX_ATTRIBUTES, MAX_OPTIONS = 3, 2
KINDS = ("add_attribute", "swap_attribute", "add_option", "change_option", "tighten_price")


def synthetic_task_id(goal: ShopGoal) -> str:
    digest = hashlib.sha1(json.dumps(goal.to_dict(), sort_keys=True).encode()).hexdigest()[:12]
    return f"shop-syn-{digest}"


def _vary(goal: ShopGoal, product: Product, kind: str, rng: random.Random) -> ShopGoal | None:
    if kind == "add_attribute":
        extra = [a for a in product.attributes if a not in goal.attributes]
        if not extra or len(goal.attributes) >= MAX_ATTRIBUTES:
            return None
        return replace(goal, attributes=(*goal.attributes, rng.choice(extra)))
    if kind == "swap_attribute":
        extra = [a for a in product.attributes if a not in goal.attributes]
        if not extra or not goal.attributes:
            return None
        attrs = list(goal.attributes)
        attrs[rng.randrange(len(attrs))] = rng.choice(extra)
        return replace(goal, attributes=tuple(attrs))
    if kind == "add_option":
        free = [(n, vs) for n, vs in product.options if n not in goal.options]
        if not free or len(goal.options) >= MAX_OPTIONS:
            return None
        name, values = rng.choice(free)
        return replace(goal, options=dict(sorted({**goal.options, name: rng.choice(values)}.items())))
    if kind == "change_option":
        offered = dict(product.options)
        changeable = [n for n in goal.options if len(offered.get(n, ())) > 1]
        if not changeable:
            return None
        name = rng.choice(changeable)
        value = rng.choice([v for v in offered[name] if v != goal.options[name]])
        return replace(goal, options={**goal.options, name: value})
    if kind == "tighten_price":
        step = 1.0 if product.price < 50 else 5.0
        bound = math.ceil(product.price * rng.uniform(1.01, 1.15) / step) * step
        return replace(goal, price_upper=bound) if product.price <= bound < goal.price_upper else None
    raise ValueError(f"unknown shop variation {kind!r}; known: {', '.join(KINDS)}")


class ShopVariationOperator:
    """``operator(seed_task, n, rng)`` -> up to ``n`` distinct feasible variations of ``seed_task``."""

    def __init__(self, num_products: int = 1000, catalog_seed: int = 0) -> None:
        self.catalog: Catalog = build_catalog(num_products, catalog_seed)

    def __call__(self, seed: Task, n: int, rng: random.Random) -> list[Task]:
        goal = ShopGoal.from_dict(seed.goal, seed.task_id)
        if goal.asin is None:
            return []  # no target product to keep the variation feasible with
        product = self.catalog.get(goal.asin)
        out: dict[str, Task] = {}
        for _ in range(4 * n):
            if len(out) >= n:
                break
            varied = _vary(goal, product, rng.choice(KINDS), rng)
            if varied is None or varied == goal or not satisfies(varied, product):
                continue
            task_id = synthetic_task_id(varied)
            out[task_id] = Task(task_id=task_id, instruction=write_instruction(varied, rng.choice(TEMPLATES)),
                                env="shop", goal=varied.to_dict(), origin="synthetic", parent_id=seed.task_id)
        return list(out.values())
