"""Shop tasks: natural-language instructions written from a target product, WebShop style.

A task names the target's category, 1-3 of its attributes, 0-2 of its options (with one of the offered
values) and a price bound above its price. Train, val and test tasks come from disjoint sets of target products.

The val split is opt-in (``val_fraction > 0``): with the default tasks every product of the catalog is already
the target of a train or a test task, so val's products can only come from train's. Test's targets never
depend on ``val_fraction``, and ``val_fraction=0`` (the default) leaves train exactly as before val existed.
"""

from __future__ import annotations

import functools
import math
import random

from dreamgym.envs.shop.catalog import Product, build_catalog, category_spec
from dreamgym.envs.shop.reward import ShopGoal
from dreamgym.envs.shop.vocab import OPTION_PHRASES
from dreamgym.types import Task

SPLITS = ("train", "val", "test")
TEMPLATES = (
    "i am looking for {np}{opts}, and price lower than {price} dollars",
    "i need {np}{opts}, and price lower than {price} dollars",
    "find me {np}{opts}, with price lower than {price} dollars",
    "i want to buy {np}{opts}, and price lower than {price} dollars",
)


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def option_phrase(name: str, value: str) -> str:
    return OPTION_PHRASES.get(name, f"with {name} {{v}}").format(v=value)


def write_instruction(goal: ShopGoal, template: str = TEMPLATES[0]) -> str:
    """The instruction of a goal, e.g. "i need a slim fit t-shirt in red, and price lower than 30.00 dollars"."""
    noun_phrase = " ".join([*([_join(list(goal.attributes))] if goal.attributes else []), goal.category])
    if category_spec(goal.category).countable:
        noun_phrase = ("an " if noun_phrase[0] in "aeiou" else "a ") + noun_phrase
    opts = " " + " and ".join(option_phrase(n, v) for n, v in goal.options.items()) if goal.options else ""
    price = f"{goal.price_upper:.2f}"
    return template.format(np=noun_phrase, opts=opts, price=price)


def price_bound(price: float, rng: random.Random) -> float:
    """A round bound 5-60% above ``price`` (WebShop's bounds are round numbers like 30.00 or 100.00)."""
    step = 5.0 if price < 50 else 10.0 if price < 200 else 50.0
    return math.ceil(price * rng.uniform(1.05, 1.6) / step) * step


def goal_for(product: Product, rng: random.Random) -> ShopGoal:
    attributes = rng.sample(product.attributes, rng.randint(1, min(3, len(product.attributes))))
    named = rng.sample(product.options, rng.randint(0, min(2, len(product.options))))
    options = {name: rng.choice(values) for name, values in sorted(named)}
    return ShopGoal(product.category, tuple(attributes), options, price_bound(product.price, rng), product.asin)


def split_targets(num_products: int, seed: int, test_fraction: float, val_fraction: float = 0.0) -> dict[str, list[int]]:
    """Catalog indices of the target products of each split (disjoint; train and test get at least one each).

    One seeded shuffle of the catalog: test takes the first ``test_fraction``, val the next ``val_fraction``
    (none by default), train the rest. So test's targets do not depend on ``val_fraction``, and with
    ``val_fraction=0`` train's are the same as before val existed.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not 0.0 <= val_fraction < 1.0 or test_fraction + val_fraction >= 1.0:
        raise ValueError(f"val_fraction must be in [0, 1 - test_fraction), got {val_fraction} (test_fraction {test_fraction})")
    if num_products < 2:
        raise ValueError(f"the shop needs >= 2 products to split train/test targets, got {num_products}")
    order = list(range(num_products))
    random.Random(f"dreamgym-shop-split-{seed}").shuffle(order)
    n_test = min(num_products - 1, max(1, round(num_products * test_fraction)))
    n_val = 0 if val_fraction == 0 else max(1, round(num_products * val_fraction))
    if n_test + n_val >= num_products:
        raise ValueError(f"val_fraction {val_fraction}: {num_products} products leave no train targets "
                         f"({n_test} test, {n_val} val)")
    return {"test": sorted(order[:n_test]), "val": sorted(order[n_test:n_test + n_val]),
            "train": sorted(order[n_test + n_val:])}


@functools.lru_cache(maxsize=8)
def build_tasks(
    num_products: int, catalog_seed: int, split: str, num_tasks: int, test_fraction: float = 0.2,
    val_fraction: float = 0.0,
) -> tuple[Task, ...]:
    """``num_tasks`` tasks of ``split``, ids ``shop-<split>-00000``...; deterministic given the arguments.

    Each split draws its tasks from its own RNG stream (seeded by the split's name), so making one split's
    tasks never moves another's.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown shop split {split!r}; use one of {', '.join(SPLITS)}")
    targets = split_targets(num_products, catalog_seed, test_fraction, val_fraction)[split]
    if not targets:
        raise ValueError("shop env: the val split is off (val_fraction=0, the default, which keeps the train "
                         "targets of earlier runs); pass val_fraction > 0, e.g. --env-arg val_fraction=0.1")
    catalog = build_catalog(num_products, catalog_seed)
    rng = random.Random(f"dreamgym-shop-tasks-{catalog_seed}-{split}")
    rng.shuffle(targets)  # cycle through every target product before any repeats
    tasks = []
    for i in range(num_tasks):
        goal = goal_for(catalog.products[targets[i % len(targets)]], rng)
        tasks.append(
            Task(
                task_id=f"shop-{split}-{i:05d}",
                instruction=write_instruction(goal, rng.choice(TEMPLATES)),
                env="shop",
                goal=goal.to_dict(),
            )
        )
    return tuple(tasks)
