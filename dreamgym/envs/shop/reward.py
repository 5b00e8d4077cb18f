"""WebShop's purchase reward (Yao et al. 2022, Sec. 3.1), with exact matching on our structured catalog.

    r = r_type * (|matched attributes| + |matched options| + [price <= bound]) / (|attributes| + |options| + 1)

WebShop's r_type compares product types by text matching and floors a mismatch at 0.1; our products carry an
explicit category, so r_type is 1.0 for the goal's category and ``TYPE_MISMATCH`` (WebShop's 0.1 floor)
otherwise. An attribute matches if the bought product has it; an option matches if the value the buyer
selected equals the goal's (an unselected option does not match).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dreamgym.envs.shop.catalog import Product

TYPE_MISMATCH = 0.1
SUCCESS_EPS = 1e-9


@dataclass(frozen=True)
class ShopGoal:
    """What scoring needs; stored as ``Task.goal`` (see :meth:`to_dict`)."""

    category: str
    attributes: tuple[str, ...]
    options: dict[str, str] = field(default_factory=dict)
    price_upper: float = float("inf")
    asin: str | None = None  # the target product the task was written from (None for synthetic goals)

    def to_dict(self) -> dict[str, Any]:
        return {
            "asin": self.asin,
            "category": self.category,
            "attributes": list(self.attributes),
            "options": dict(self.options),
            "price_upper": self.price_upper,
        }

    @classmethod
    def from_dict(cls, goal: Mapping[str, Any], task_id: str = "?") -> ShopGoal:
        """Parse a ``Task.goal``; a missing or mistyped field raises a one-line ``ValueError``."""
        where = f"shop task {task_id!r} goal"
        if not isinstance(goal.get("category"), str):
            raise ValueError(f"{where}: 'category' must be a string, got {goal.get('category')!r}")
        attributes = goal.get("attributes", [])
        if not isinstance(attributes, list | tuple) or not all(isinstance(a, str) for a in attributes):
            raise ValueError(f"{where}: 'attributes' must be a list of strings, got {attributes!r}")
        options = goal.get("options", {})
        if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
            raise ValueError(f"{where}: 'options' must map option names to values, got {options!r}")
        price = goal.get("price_upper", float("inf"))
        if isinstance(price, bool) or not isinstance(price, int | float):
            raise ValueError(f"{where}: 'price_upper' must be a number, got {price!r}")
        asin = goal.get("asin")
        return cls(goal["category"], tuple(attributes), dict(options), float(price), asin if isinstance(asin, str) else None)


@dataclass(frozen=True)
class RewardBreakdown:
    r_type: float
    attributes_matched: int
    options_matched: int
    price_ok: bool
    total: float

    @property
    def success(self) -> bool:
        return abs(self.total - 1.0) < SUCCESS_EPS

    def to_dict(self) -> dict[str, Any]:
        return {
            "r_type": self.r_type,
            "attributes_matched": self.attributes_matched,
            "options_matched": self.options_matched,
            "price_ok": self.price_ok,
            "total": self.total,
        }


def purchase_reward(goal: ShopGoal, product: Product, selected: Mapping[str, str]) -> RewardBreakdown:
    """The reward for buying ``product`` with the option values ``selected`` (option name -> value)."""
    r_type = 1.0 if product.category == goal.category else TYPE_MISMATCH
    attributes = sum(a in product.attributes for a in goal.attributes)
    options = sum(selected.get(name) == value for name, value in goal.options.items())
    price_ok = product.price <= goal.price_upper
    total = r_type * (attributes + options + int(price_ok)) / (len(goal.attributes) + len(goal.options) + 1)
    return RewardBreakdown(r_type, attributes, options, price_ok, total)


def satisfies(goal: ShopGoal, product: Product) -> bool:
    """Whether buying ``product`` with the goal's options selected earns reward 1 (an equivalent product)."""
    offered = all(value in product.option_values(name) for name, value in goal.options.items())
    return offered and purchase_reward(goal, product, goal.options).success
