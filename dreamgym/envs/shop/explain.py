"""The shop's rule-based annotator: a reasoning trace for each real transition, from the env's ground truth.

The trace is what the experience model writes *before* the next state, so it is built to make that state and
its reward easy to predict for a small model, which learns to copy and compare slowly (the README's
experience-model ablations): one line per step, fixed order, short local steps, each a copy of a value shown in the
task or the current state (an element id, a product id, a title, a price, an option line) or one comparison,
ending with ``-> <where the action leads>``::

    search "bed sheets cotton" -> results page 1, 1-5 of 50
    open [4] B0N38ATR "Torzu Cotton Bed Sheets, Breathable" $42.37 -> item page
    select [9] size=queen on B0N38ATR -> item page, size=queen selected, size=king unselected
    next on results page 1 -> results page 2, 6-10 of 50
    prev on item B0N38ATR -> results page 1, 1-5 of 50
    features of B0N38ATR -> features page
    buy B0N38ATR; type bed sheets=bed sheets y; attr cotton title y; attr cooling unseen n; \
opt size=queen sel y; price 42.37<=70.00 y; score 4/5=0.80 -> done
    invalid: click[xyz] not on this page -> state unchanged, reward 0

A purchase is checked in the order of :func:`~dreamgym.envs.shop.reward.purchase_reward`: product type, the
task's attributes, its options (is ``name=value (selected)`` on the item page), the price against the task's
bound, then the score (``0.1*`` in front for another product type). The item page shows two of a product's
attributes, in its title; an attribute the title does not show is written ``unseen`` and its y/n comes from
the catalog (the description and features pages list all of them), so the model can tell the checks it can
copy from the ones it has to guess.

Ground truth comes from replaying the recorded actions in a shop rebuilt from ``meta["env_kwargs"]``: every
replayed observation must equal the recorded next state and every reward the recorded reward. From the first
mismatch on (another catalog, synthetic data, a bug) the remaining steps get a plain text-only trace, and the
explanation counts ``replay_mismatch`` / ``reward_mismatch`` (logged), so a wrong trace is never silent.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping

from dreamgym.envs.base import make, truncate
from dreamgym.envs.shop.catalog import Catalog, Product
from dreamgym.envs.shop.env import ShopEnv, parse_action
from dreamgym.envs.shop.pages import Click, Page, ShopState
from dreamgym.envs.shop.reward import ShopGoal, purchase_reward
from dreamgym.envs.shop.vocab import CATEGORY_BY_NAME
from dreamgym.types import DataError, Explanation, Trajectory, Transition

log = logging.getLogger(__name__)

INVALID_OUTCOME = "-> state unchanged, reward 0"
MAX_QUOTED = 40  # characters of a free-form action argument quoted in a trace


# ------------------------------------------------------------------------------------------ pieces


def _yn(ok: bool) -> str:
    return "y" if ok else "n"


def short(text: str, limit: int = MAX_QUOTED) -> str:
    return truncate(" ".join(text.split()), limit)


def _bound(price_upper: float) -> str:
    return "no limit" if math.isinf(price_upper) else f"{price_upper:.2f}"


def title_attributes(product: Product) -> set[str]:
    """The attributes the item page shows: the two in the title, which the catalog writes as
    ``"<Brand> <Attribute> <Noun>, <Attribute>"`` (see ``catalog._make_product``)."""
    head, _, tail = product.title.partition(", ")
    noun = CATEGORY_BY_NAME[product.category].noun
    first = head.partition(" ")[2].removesuffix(" " + noun)
    return {first.lower(), tail.lower()} & set(product.attributes)


def _element_id(page: Page, text: str) -> str:
    """The id of the element whose text is ``text`` or starts with it and a space (e.g. an ASIN line)."""
    for e in page.elements:
        if e.text == text or e.text.startswith(text + " "):
            return e.id
    return "?"


def results_summary(state: ShopState, per_page: int) -> str:
    total = len(state.results)
    if total == 0:
        return "no results"
    first = (state.page_no - 1) * per_page + 1
    return f"results page {state.page_no}, {first}-{min(first + per_page - 1, total)} of {total}"


def purchase_trace(goal: ShopGoal, product: Product, selected: Mapping[str, str], at: str = "") -> tuple[str, float]:
    """The checks of a purchase and its score, and that score (the shop's reward for it); ``at`` follows ``buy``
    (the browser's `` [bid]``)."""
    b = purchase_reward(goal, product, selected)
    shown = title_attributes(product)
    steps = [f"buy{at} {product.asin}", f"type {goal.category}={product.category} {_yn(b.r_type == 1.0)}"]
    steps += [f"attr {a} {'title' if a in shown else 'unseen'} {_yn(a in product.attributes)}" for a in goal.attributes]
    steps += [f"opt {n}={v} sel {_yn(selected.get(n) == v)}" for n, v in goal.options.items()]
    steps.append(f"price {product.price:.2f}<={_bound(goal.price_upper)} {_yn(b.price_ok)}")
    matched = b.attributes_matched + b.options_matched + int(b.price_ok)
    factor = "" if b.r_type == 1.0 else f"{b.r_type:g}*"
    steps.append(f"score {factor}{matched}/{len(goal.attributes) + len(goal.options) + 1}={b.total:.2f} -> done")
    return "; ".join(steps), b.total


def invalid_trace(action: str, page: Page) -> str:
    """Why an action changed nothing: malformed, a search off the search page, or a click on no element."""
    parsed = parse_action(action)
    if parsed is None:
        why = f'"{short(action)}" is not search[...] or click[...]'
    elif parsed[0] == "search":
        why = f"search only works on the search page, not on the {page.kind} page"
    else:
        why = f"click[{short(parsed[1])}] not on this page"
    return f"invalid: {why} {INVALID_OUTCOME}"


def text_only_trace(x: Transition) -> str:
    """A trace from the recorded text alone, for steps the replay cannot explain."""
    if x.info.get("invalid_action"):
        return f"invalid: {short(x.action)} {INVALID_OUTCOME}"
    lines = x.next_state.strip().splitlines()
    first = lines[0].split(": ", 1)[-1] if lines else ""
    return f"{short(x.action)} -> {short(first, 60)}, reward {x.reward:.2f}"


def step_trace(env: ShopEnv, before: ShopState, page: Page, action: str, info: Mapping[str, object]) -> str:
    """The trace of one replayed step: ``before``/``page`` as they were, ``env`` already stepped."""
    if info.get("invalid_action"):
        return invalid_trace(action, page)
    parsed = parse_action(action)
    assert parsed is not None, "a valid action parses"
    verb, arg = parsed
    if verb == "search":
        return f'search "{short(arg)}" -> {results_summary(env.state, env.results_per_page)}'
    return click_trace(env.catalog, env.results_per_page, env.goal or ShopGoal("", ()), before, env.state,
                       page.clicks[arg], lambda text: _element_id(page, text))


def click_trace(catalog: Catalog, per_page: int, goal: ShopGoal, before: ShopState, after: ShopState, click: Click,
                element_id: Callable[[str], str], name_all: bool = False) -> str:
    """The trace of a click from ``before`` to ``after``. ``element_id(text)`` is the id of the clicked element
    (by its text) in the product and option lines; ``name_all`` names it in every line (the browser's bids)."""
    product = None if before.item is None else catalog.products[before.item]
    asin = product.asin if product is not None else "?"
    at = f" [{element_id('')}]" if name_all else ""
    if click.kind == "item":
        assert click.item is not None
        p = catalog.products[click.item]
        return f'open [{element_id(p.asin)}] {p.asin} "{p.title}" ${p.price:.2f} -> item page'
    if click.kind == "option":
        assert click.option is not None
        name, value = click.option
        was = dict(before.selected).get(name)
        head = f"select [{element_id(f'{name}={value}')}] {name}={value} on {asin}"
        if was == value:
            return f"{head} -> item page unchanged, already selected"
        return f"{head} -> item page, {name}={value} selected" + (f", {name}={was} unselected" if was else "")
    if click.kind in ("next", "prev") and before.page == "results":
        return f"{click.kind}{at} on results page {before.page_no} -> {results_summary(after, per_page)}"
    if click.kind == "prev" and before.page == "item":
        return f"prev{at} on item {asin} -> {results_summary(after, per_page)}"
    if click.kind == "prev":  # from the description or features page, back to the item page as it was
        kept = "".join(f", {n}={v} selected" for n, v in before.selected)
        return f"prev{at} on {before.page} of {asin} -> item page {asin}{kept}"
    if click.kind == "back_to_search":
        return f"back to search{at} -> search page"
    if click.kind in ("description", "features"):
        return f"{click.kind}{at} of {asin} -> {click.kind} page"
    assert click.kind == "buy" and product is not None
    trace, _ = purchase_trace(goal, product, dict(before.selected), at)
    return trace


def task_tutorial(goal: ShopGoal, max_steps: int) -> dict[str, str]:
    """The task tutorial from the goal: the oracle's plan and what raises or lowers the score."""
    attrs = ", ".join(goal.attributes) or "any attributes"
    opts = ", ".join(f"{n}={v}" for n, v in goal.options.items())
    price = _bound(goal.price_upper)
    query = " ".join([goal.category, *goal.attributes, *goal.options.values()])
    requirements = [*goal.attributes, *(f"{n}={v} selected" for n, v in goal.options.items()), f"price <= {price}"]
    return {
        "Overall Plan": f'search "{query}"; open a {goal.category} item with {attrs} priced <= {price}; '
        + (f"select {opts}; " if opts else "")
        + "buy now",
        "Success Mode": f"buy a {goal.category} item with {attrs}" + (f", {opts} selected" if opts else "")
        + f", price <= {price}: score 1.00",
        "Failure Mode": f"score = requirements met / {len(requirements)} ({'; '.join(requirements)}); another "
        f"product type scores 0.1*; an invalid action leaves the page unchanged; no purchase within {max_steps} "
        "steps scores 0",
    }


# ------------------------------------------------------------------------------------------ replay


@functools.lru_cache(maxsize=8)
def _shop(kwargs_json: str) -> ShopEnv:
    env = make("shop", **json.loads(kwargs_json))
    assert isinstance(env, ShopEnv)
    return env


def replay_env(traj: Trajectory) -> ShopEnv:
    """The shop the trajectory was recorded in (``meta["env_kwargs"]``), reset to its task and seed."""
    kwargs = traj.meta.get("env_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise DataError(f"trajectory {traj.traj_id}: meta.env_kwargs must be an object, got {kwargs!r}")
    try:
        env = _shop(json.dumps(kwargs, sort_keys=True))
    except TypeError as e:
        raise DataError(f"trajectory {traj.traj_id}: cannot rebuild the shop from {kwargs}: {e}") from None
    seed = traj.meta.get("seed")
    env.reset(seed=seed if isinstance(seed, int) else None, options={"task": traj.task})
    return env


def explain_trajectory(traj: Trajectory) -> Explanation:
    """One trace per transition, the task tutorial, and counted issues (``replay_mismatch``, ``reward_mismatch``,
    ``text_only_steps``). Raises :class:`~dreamgym.types.DataError` for a task the shop cannot play."""
    try:
        goal = ShopGoal.from_dict(traj.task.goal, traj.task.task_id)
        env = replay_env(traj)
    except ValueError as e:  # DataError included
        raise DataError(f"trajectory {traj.traj_id}: {str(e).splitlines()[0]}") from None
    issues: Counter[str] = Counter()
    traces: list[str] = []
    in_sync = bool(traj.transitions) and env.observation == traj.transitions[0].state
    for t, x in enumerate(traj.transitions):
        trace = _replayed_trace(env, x, issues) if in_sync else None
        if trace is None:
            if in_sync or t == 0:
                issues["replay_mismatch"] += 1
                log.warning("trajectory %s: the shop replay differs from the record at step %d", traj.traj_id, t)
            in_sync = False
            issues["text_only_steps"] += 1
            trace = text_only_trace(x)
        traces.append(trace)
    return Explanation(traces, task_tutorial(goal, env.max_steps), issues)


def _replayed_trace(env: ShopEnv, x: Transition, issues: Counter[str]) -> str | None:
    """Step the replay with the recorded action; the trace, or None if the replay does not match the record."""
    before, page = env.state, env.page
    obs, reward, _, _, info = env.step(x.action)
    invalid = bool(info["invalid_action"])
    if obs != x.next_state or invalid != bool(x.info.get("invalid_action", invalid)):
        return None
    if abs(reward - x.reward) > 1e-6:
        issues["reward_mismatch"] += 1
        log.warning("shop reward %.4f differs from the recorded %.4f for %r", reward, x.reward, x.action)
        return None
    return step_trace(env, before, page, x.action, info)
