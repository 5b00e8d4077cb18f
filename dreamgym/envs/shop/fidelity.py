"""Automatic causal-consistency checks of dreamt shop transitions, judged by code against the shop's rules.

Each check looks at one step (the real state and action, the task goal) and the experience model's answer
(dreamt next state and reward), and says whether the answer is what the shop's rules imply for the *real*
state and action; a step the check does not apply to gets None. An invalid (unparsable) answer fails every
check that applies to its step (reason ``invalid_output``): the failure state the dream serves instead is
not the model's answer.

* :func:`click_check`: a click on a result link must open that product's item page: the dreamt state has the
  text lines ``<ASIN> — <title>`` and ``Price: $<price>`` exactly as the clicked link
  ``<ASIN> — <title> | $<price>`` shows them in the current state.
* :func:`item_options_check`: that item page lists the product's options, every ``name=value`` line in the
  catalog's order (the results page does not show them: a model copies them from a retrieved page that shows
  them, or knows the catalog; :func:`click_check` alone passes a page with the right title and made-up options).
* :func:`option_check`: a click on an option of an item page keeps the product (its id/title and price lines)
  and marks the clicked ``name=value (selected)``.
* :func:`reward_check`: buying from an item page earns :func:`~dreamgym.envs.shop.reward.purchase_reward` of
  the task goal for the product and the options selected *on the real item page* (rounded to the 2 decimals
  the protocol writes); the dreamt reward must equal it. What the dreamt done page claims was bought plays no
  part (a dreamt "you bought the target, reward 1.0" after buying another product is inconsistent). The
  product's category, attributes and price come from the catalog, looked up by the page's id: the item page
  shows only two attributes.
* :func:`purchase_page_check`: the dreamt page after a purchase is a done page naming that real product and
  those options (``You bought <ASIN> (<options>)``).
* Every other step must have reward 0 (:func:`zero_reward_check`): the shop rewards purchases only.

:func:`consistency_report` aggregates them over many steps (rates and counted failure reasons);
:func:`check_steps` runs them on held-out trajectories (goal from the task, catalog rebuilt from the
trajectory's ``meta["env_kwargs"]``).
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dreamgym.envs.base import make, parse_elements
from dreamgym.envs.shop.catalog import Catalog
from dreamgym.envs.shop.env import ShopEnv, parse_action
from dreamgym.envs.shop.reward import ShopGoal, purchase_reward
from dreamgym.types import DataError, ExperiencePrediction, Trajectory

_BOUGHT = re.compile(r"You bought (\S+) \((.*)\)\s*$")
_OPTION = re.compile(r"^(.+?)=(.+?)( \(selected\))?$")
REWARD_TOL = 0.005 + 1e-9  # the protocol writes rewards with 2 decimals


@dataclass(frozen=True)
class Check:
    """The verdict of one check on one step; ``reason`` names what was wrong (empty when ``ok``)."""

    ok: bool
    reason: str = ""


def elements(state: str) -> list[tuple[str, str]]:
    """The ``(type, text)`` of each ``[id] type: text`` line of an abstract state."""
    return [(e.type, e.text) for e in parse_elements(state) if e.id.isdigit()]


def _texts(state: str) -> list[str]:
    return [text for kind, text in elements(state) if kind == "text"]


def _is_item_page(state: str) -> bool:
    return any(kind == "button" and text == "Buy Now" for kind, text in elements(state))


def clicked_link(state: str, action: str) -> tuple[str, str] | None:
    """``(header, price line)`` an item page must show after ``action`` clicks a result link of ``state``."""
    parsed = parse_action(action)
    if parsed is None or parsed[0] != "click":
        return None
    for kind, text in elements(state):
        if kind != "link" or " | " not in text:
            continue
        header, _, price = text.rpartition(" | ")
        if header.split(" — ", 1)[0].lower() == parsed[1]:
            return header, f"Price: {price}"
    return None


def click_check(state: str, action: str, dreamt: str) -> Check | None:
    """Whether the dreamt page after clicking a result link is that product's item page (None: no such click)."""
    expected = clicked_link(state, action)
    if expected is None:
        return None
    header, price = expected
    texts = _texts(dreamt)
    if not texts or texts[0].split(" — ", 1)[0] != header.split(" — ", 1)[0]:
        return Check(False, "wrong_product")
    if texts[0] != header:
        return Check(False, "wrong_title")
    if price not in texts:
        return Check(False, "wrong_price")
    return Check(True)


def item_options_check(catalog: Catalog, state: str, action: str, dreamt: str) -> Check | None:
    """Whether the dreamt item page after clicking a result link lists that product's options exactly (None: no
    such click, or a product the catalog does not hold)."""
    expected = clicked_link(state, action)
    if expected is None:
        return None
    try:
        product = catalog.get(expected[0].split(" — ", 1)[0])
    except KeyError:
        return None
    want = [f"{name}={value}" for name, values in product.options for value in values]
    got = [text for kind, text in elements(dreamt) if kind == "option"]
    if got == want:
        return Check(True)
    return Check(False, "wrong_option_values" if len(got) == len(want) else "wrong_option_count")


def option_check(state: str, action: str, dreamt: str) -> Check | None:
    """Whether the dreamt page after an option click is the same product with that option selected."""
    parsed = parse_action(action)
    if parsed is None or parsed[0] != "click" or not _is_item_page(state):
        return None
    options = [_OPTION.match(text) for kind, text in elements(state) if kind == "option"]
    clicked = next((m for m in options if m is not None and m.group(2).lower() == parsed[1]), None)
    if clicked is None:
        return None
    before, after = _texts(state), _texts(dreamt)
    if after[:2] != before[:2]:
        return Check(False, "wrong_product")
    selected = f"{clicked.group(1)}={clicked.group(2)} (selected)"
    if not any(kind == "option" and text == selected for kind, text in elements(dreamt)):
        return Check(False, "option_not_selected")
    return Check(True)


def bought(dreamt: str) -> tuple[str, dict[str, str]] | None:
    """``(ASIN, {option: value})`` named by a done page (``You bought B0X (color=red, size=m)``), else None."""
    for text in _texts(dreamt):
        match = _BOUGHT.search(text)
        if match is None:
            continue
        chosen = match.group(2)
        if chosen == "no options":
            return match.group(1), {}
        pairs = [p.split("=", 1) for p in re.split(r", (?=[^,=]+=)", chosen)]
        if any(len(p) != 2 for p in pairs):
            return None
        return match.group(1), {name: value for name, value in pairs}
    return None


def is_purchase(state: str, action: str) -> bool:
    """Whether ``action`` clicks Buy Now on an item page (the only step the shop rewards)."""
    return _is_item_page(state) and parse_action(action) == ("click", "buy now")


def item_on_page(state: str) -> tuple[str, dict[str, str]] | None:
    """``(ASIN, {option: value selected})`` of an item page (its first text line is ``<ASIN> — <title>``)."""
    texts = _texts(state)
    if not _is_item_page(state) or not texts:
        return None
    selected = {}
    for kind, text in elements(state):
        match = _OPTION.match(text) if kind == "option" else None
        if match is not None and match.group(3):
            selected[match.group(1)] = match.group(2)
    return texts[0].split(" — ", 1)[0].strip(), selected


def real_purchase_reward(goal: ShopGoal, catalog: Catalog, state: str) -> float:
    """The shop's reward (2 decimals) for clicking Buy Now on the real item page ``state``.

    Raises :class:`DataError` when ``state`` is not an item page of a product of ``catalog`` (the data and the
    catalog rebuilt for it disagree).
    """
    item = item_on_page(state)
    if item is None:
        raise DataError(f"not a shop item page: {state.splitlines()[0] if state else state!r}")
    asin, selected = item
    try:
        product = catalog.get(asin)
    except KeyError:
        raise DataError(f"item page of {asin}, which the shop's catalog does not have (wrong meta.env_kwargs?)") from None
    return round(purchase_reward(goal, product, selected).total, 2)


def reward_check(goal: ShopGoal, catalog: Catalog, state: str, reward: float) -> Check:
    """Whether the dreamt ``reward`` of buying from the real item page ``state`` is the shop's reward for it."""
    expected = real_purchase_reward(goal, catalog, state)
    return Check(True) if abs(reward - expected) <= REWARD_TOL else Check(False, "reward_differs")


def purchase_page_check(state: str, dreamt: str) -> Check:
    """Whether the dreamt page after buying from the real item page ``state`` names that product and options."""
    purchase, item = bought(dreamt), item_on_page(state)
    if purchase is None:
        return Check(False, "no_purchase_page")
    if item is None or purchase[0].upper() != item[0].upper():
        return Check(False, "wrong_product")
    return Check(True) if purchase[1] == item[1] else Check(False, "wrong_options")


def zero_reward_check(reward: float) -> Check:
    return Check(True) if reward == 0.0 else Check(False, "reward_without_purchase")


@dataclass(frozen=True)
class ShopStep:
    """One held-out step and the model's answer to it, as the checks need it."""

    goal: ShopGoal
    catalog: Catalog
    state: str
    action: str
    dreamt_state: str
    dreamt_reward: float
    failure: str | None = None  # the parse failure of an invalid answer (its dreamt fields are the fallback)


def _rate(checks: Sequence[Check]) -> dict[str, Any]:
    failures = Counter(c.reason for c in checks if not c.ok)
    return {
        "rate": sum(c.ok for c in checks) / len(checks) if checks else None,
        "n": len(checks),
        "failures": dict(sorted(failures.items())),
    }


def consistency_report(steps: Sequence[ShopStep]) -> dict[str, Any]:
    """Rates (None where no step applies), counts and failure reasons of the six checks over ``steps``."""
    parts: dict[str, list[Check]] = {"click": [], "item_options": [], "option": [], "reward": [], "purchase_page": [],
                                     "zero_reward": []}
    invalid = Check(False, "invalid_output")
    for s in steps:
        verdicts: dict[str, Check | None] = {
            "click": click_check(s.state, s.action, s.dreamt_state),
            "item_options": item_options_check(s.catalog, s.state, s.action, s.dreamt_state),
            "option": option_check(s.state, s.action, s.dreamt_state),
        }
        if is_purchase(s.state, s.action):
            verdicts["reward"] = reward_check(s.goal, s.catalog, s.state, s.dreamt_reward)
            verdicts["purchase_page"] = purchase_page_check(s.state, s.dreamt_state)
        else:
            verdicts["zero_reward"] = zero_reward_check(s.dreamt_reward)
        for name, verdict in verdicts.items():
            if verdict is not None:
                parts[name].append(invalid if s.failure is not None else verdict)
    rates = {name: _rate(checks) for name, checks in parts.items()}
    return {**{f"{name}_consistency": rate["rate"] for name, rate in rates.items()}, "consistency_checks": rates}


@functools.lru_cache(maxsize=4)
def _catalog(kwargs_json: str) -> Catalog:
    env = make("shop", **json.loads(kwargs_json))
    assert isinstance(env, ShopEnv)
    return env.catalog


def catalog_of(traj: Trajectory) -> Catalog:
    """The catalog of the shop a trajectory was recorded in (rebuilt from ``meta["env_kwargs"]``)."""
    kwargs = traj.meta.get("env_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise DataError(f"trajectory {traj.traj_id}: meta.env_kwargs must be an object, got {kwargs!r}")
    try:
        return _catalog(json.dumps(kwargs, sort_keys=True))
    except TypeError as e:
        raise DataError(f"trajectory {traj.traj_id}: cannot rebuild the shop from {kwargs}: {e}") from None


def check_steps(items: Sequence[tuple[Trajectory, int, ExperiencePrediction]]) -> dict[str, Any]:
    """:func:`consistency_report` for ``(held-out trajectory, step, dreamt answer)`` triples of the shop."""
    steps = []
    for traj, t, prediction in items:
        x = traj.transitions[t]
        goal = ShopGoal.from_dict(traj.task.goal, traj.task.task_id)
        steps.append(ShopStep(goal, catalog_of(traj), x.state, x.action, prediction.next_state, prediction.reward,
                              prediction.failure))
    return consistency_report(steps)
