"""The built-in shop env: reward, catalog, tasks, pages, invalid actions, policies."""

from __future__ import annotations

import hashlib
import json
import re
import time

import pytest

from dreamgym.collect import evaluate_scripted, run_episode
from dreamgym.envs import StateMapper, make
from dreamgym.envs.shop import (
    Product,
    ShopEnv,
    ShopGoal,
    ShopStateMapper,
    build_catalog,
    build_tasks,
    parse_action,
    purchase_reward,
    satisfies,
)
from dreamgym.envs.shop.reward import TYPE_MISMATCH
from dreamgym.envs.shop.search import SearchEngine
from dreamgym.envs.shop.tasks import split_targets
from dreamgym.envs.shop.vocab import CATEGORIES
from dreamgym.types import Task

N = 300  # a small catalog keeps the tests fast; the default 1,000 is exercised by the policy tests


@pytest.fixture(scope="module")
def env() -> ShopEnv:
    shop = make("shop", num_products=N, num_tasks_per_split=200)
    assert isinstance(shop, ShopEnv)
    return shop


def tee(category: str = "t-shirt", price: float = 20.0, attributes: tuple[str, ...] = ("cotton", "slim fit")) -> Product:
    options = (("color", ("red", "blue")), ("size", ("s", "m")))
    return Product("B0TEST01", category, "Acme", "Acme Cotton T-Shirt, Slim Fit", price, attributes, options, "", ())


GOAL = ShopGoal("t-shirt", ("cotton", "slim fit"), {"color": "red", "size": "m"}, 30.0, "B0TEST01")


# -- reward -----------------------------------------------------------------------------------------


def test_reward_all_matched_is_success() -> None:
    r = purchase_reward(GOAL, tee(), {"color": "red", "size": "m"})
    assert r.total == pytest.approx(1.0) and r.success
    assert (r.attributes_matched, r.options_matched, r.price_ok) == (2, 2, True)
    assert satisfies(GOAL, tee())


def test_reward_partial() -> None:
    # 1 of 2 attributes, 1 of 2 options (size s is wrong), price ok: 3 / 5
    r = purchase_reward(GOAL, tee(attributes=("cotton",)), {"color": "red", "size": "s"})
    assert r.total == pytest.approx(3 / 5) and not r.success
    # an option left unselected does not match: 2 + 1 + 1 of 5
    assert purchase_reward(GOAL, tee(), {"color": "red"}).total == pytest.approx(4 / 5)


def test_reward_wrong_category_and_price_over() -> None:
    wrong = purchase_reward(GOAL, tee(category="backpack"), {"color": "red", "size": "m"})
    assert wrong.r_type == TYPE_MISMATCH and wrong.total == pytest.approx(TYPE_MISMATCH)
    over = purchase_reward(GOAL, tee(price=30.01), {"color": "red", "size": "m"})
    assert not over.price_ok and over.total == pytest.approx(4 / 5)
    assert not satisfies(GOAL, tee(price=30.01))
    assert purchase_reward(GOAL, tee(price=30.0), {"color": "red", "size": "m"}).success  # bound inclusive


def test_goal_round_trip_and_malformed_goals() -> None:
    assert ShopGoal.from_dict(GOAL.to_dict()) == GOAL
    for bad in ({}, {"category": 3}, {"category": "sofa", "attributes": "velvet"},
                {"category": "sofa", "options": {"color": 1}}, {"category": "sofa", "price_upper": "cheap"}):
        with pytest.raises(ValueError, match="goal"):
            ShopGoal.from_dict(bad, "t1")


# -- catalog and tasks ------------------------------------------------------------------------------


def test_catalog_is_deterministic_by_seed_and_well_formed() -> None:
    a, b, c = build_catalog.__wrapped__(200, 7), build_catalog.__wrapped__(200, 7), build_catalog.__wrapped__(200, 8)
    assert a.products == b.products and a.products != c.products
    assert len(CATEGORIES) >= 10 and len({p.category for p in a.products}) == len(CATEGORIES)
    assert len({p.asin for p in a.products}) == 200
    for p in a.products:
        assert re.fullmatch(r"B0[A-Z0-9]{6}", p.asin)
        assert 2 <= len(p.attributes) <= 4 and p.title.startswith(p.brand)
        low, high = next(s.price for s in CATEGORIES if s.name == p.category)
        assert low <= p.price <= high
    assert a.get(a.products[5].asin.lower()) == a.products[5]


def test_option_values_are_unambiguous_within_a_category() -> None:
    for spec in CATEGORIES:
        values = [v for _, vs in spec.options for v in vs]
        assert len(values) == len(set(values)), spec.name


def test_tasks_deterministic_disjoint_and_feasible() -> None:
    train = build_tasks.__wrapped__(N, 0, "train", 400, 0.2)
    test = build_tasks.__wrapped__(N, 0, "test", 400, 0.2)
    assert train == build_tasks.__wrapped__(N, 0, "train", 400, 0.2)
    assert train != build_tasks.__wrapped__(N, 1, "train", 400, 0.2)
    assert {t.goal["asin"] for t in train}.isdisjoint({t.goal["asin"] for t in test})
    split = split_targets(N, 0, 0.2)
    assert set(split["train"]).isdisjoint(split["test"]) and len(split["train"]) + len(split["test"]) == N
    catalog = build_catalog(N, 0)
    assert test[42].task_id == "shop-test-00042"
    for task in train + test:
        goal = ShopGoal.from_dict(task.goal, task.task_id)
        assert 1 <= len(goal.attributes) <= 3 and len(goal.options) <= 2
        assert satisfies(goal, catalog.get(goal.asin or ""))  # the target itself earns reward 1
        assert goal.category in task.instruction and f"{goal.price_upper:.2f} dollars" in task.instruction
    with pytest.raises(ValueError, match="split"):
        build_tasks(N, 0, "dev", 10)


def _digest(tasks: list[Task]) -> str:
    h = hashlib.sha256()
    for t in tasks:
        h.update(json.dumps([t.task_id, t.instruction, t.goal], sort_keys=True).encode())
    return h.hexdigest()[:16]


# The default shop's train and test tasks as the code gave them before the val split existed (commit 0338b17):
# every id, instruction and goal, hashed. Recorded results reproduce only while these hold.
DEFAULT_DIGESTS = {"train": "43fd17b7d3196e62", "test": "fb0eef0dbe5b5448"}


def test_val_split_leaves_train_and_test_as_before() -> None:
    old = ShopEnv()  # the defaults of every recorded run: 1,000 products, 2,000 tasks per split, test_fraction 0.2
    train, test = old.tasks("train"), old.tasks("test")
    assert (train[0].task_id, train[0].goal["asin"], train[1].goal["asin"]) == ("shop-train-00000", "B07QHQBY", "B0O3UX25")
    assert train[0].instruction == "i am looking for a durable and water resistant backpack, and price lower than 110.00 dollars"
    assert (test[0].task_id, test[0].goal["asin"], test[1].goal["asin"]) == ("shop-test-00000", "B0QN80ND", "B0LAX62N")
    assert {s: _digest(t) for s, t in (("train", train), ("test", test))} == DEFAULT_DIGESTS
    with pytest.raises(ValueError, match="val_fraction"):  # off by default: its products would come out of train's
        old.tasks("val")
    with pytest.raises(ValueError, match="val split is off"):
        old.reset(seed=0, options={"split": "val"})
    assert old.get_task("shop-test-00001") == test[1]  # get_task looks in every split it has
    with_val = ShopEnv(val_fraction=0.1)
    assert with_val.tasks("test") == test  # test's targets and tasks never depend on val_fraction
    assert _digest(ShopEnv(num_tasks_per_split=2000, val_fraction=0.0).tasks("train")) == DEFAULT_DIGESTS["train"]


def test_val_split_is_disjoint_deterministic_and_playable() -> None:
    env = ShopEnv(num_products=N, num_tasks_per_split=400, val_fraction=0.1, num_val_tasks=90)
    splits = {s: env.tasks(s) for s in ("train", "val", "test")}
    assert len(splits["val"]) == 90 and splits["val"][0].task_id == "shop-val-00000"
    targets = split_targets(N, 0, 0.2, 0.1)
    assert len(targets["val"]) == 30 and sum(map(len, targets.values())) == N
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert {t.task_id for t in splits[a]}.isdisjoint({t.task_id for t in splits[b]}), (a, b)
        assert {t.goal["asin"] for t in splits[a]}.isdisjoint({t.goal["asin"] for t in splits[b]}), (a, b)
        assert set(targets[a]).isdisjoint(targets[b]), (a, b)
    catalog = build_catalog(N, 0)
    assert {catalog.index_of(t.goal["asin"]) for t in splits["val"]} == set(targets["val"])  # every val product
    assert ShopEnv(num_products=N, val_fraction=0.1, num_val_tasks=90).tasks("val") == splits["val"]  # deterministic
    assert build_tasks.__wrapped__(N, 0, "val", 90, 0.2, 0.1) == tuple(splits["val"])
    assert build_tasks.__wrapped__(N, 1, "val", 90, 0.2, 0.1) != tuple(splits["val"])  # another catalog seed
    obs, info = env.reset(seed=0, options={"split": "val"})
    assert info["task"] in splits["val"] and info["admissible_actions"]
    result = evaluate_scripted(env, env.scripted_policy("oracle"), 5, split="val")
    assert result.success_rate == 1.0
    for bad in ({"val_fraction": 0.8}, {"val_fraction": -0.1}, {"num_val_tasks": 0}):
        with pytest.raises(ValueError, match="val"):
            ShopEnv(num_products=N, **bad)  # type: ignore[arg-type]


# -- pages and actions ------------------------------------------------------------------------------


def test_parse_action() -> None:
    assert parse_action("CLICK[ Buy  Now ]") == ("click", "buy now")
    assert parse_action("search[Red Shirt]") == ("search", "Red Shirt")
    for bad in ("", "foo", "click[]", "search[  ]", "click[x", "jump[x]"):
        assert parse_action(bad) is None


def test_state_mapper_and_page_format(env: ShopEnv) -> None:
    assert isinstance(ShopStateMapper(), StateMapper)
    env.reset(seed=0, options={"split": "test"})
    obs, *_ = env.step("search[cotton t-shirt]")
    lines = obs.splitlines()
    assert re.fullmatch(r"\[1\] text: Page 1 \(results 1-5 of \d+\)", lines[0])
    assert all(re.fullmatch(r"\[\d+\] (text|button|link|option|searchbox): .+", line) for line in lines)
    assert sum(line.split("] ")[1].startswith("link:") for line in lines) == 5


def test_navigation_and_case_insensitive_clicks(env: ShopEnv) -> None:
    env.reset(seed=0, options={"split": "test"})
    env.step("search[cotton t-shirt]")
    page2, *_ = env.step("CLICK[Next >]")
    assert "Page 2 (results 6-10" in page2
    asin = next(t for t, c in env.page.clicks.items() if c.kind == "item")
    _, _, _, _, info = env.step(f"click[{asin.upper()}]")
    assert not info["invalid_action"] and info["page"] == "item"
    value = next(t for t, c in env.page.clicks.items() if c.kind == "option")
    selected, *_ = env.step(f"click[{value.upper()}]")
    assert "(selected)" in selected
    env.step("click[description]")
    back, *_ = env.step("click[< prev]")
    assert back == selected  # the selection survives a detour through the description
    assert env.step("click[< prev]")[0] == page2  # item -> the results page it was opened from
    search, *_ = env.step("click[back to search]")
    assert search == "[1] searchbox: search[your query]"


def test_no_results_page(env: ShopEnv) -> None:
    env.reset(seed=0, options={"split": "test"})
    obs, _, _, _, info = env.step("search[zzzqqq]")
    assert obs.startswith('[1] text: No results for "zzzqqq"')
    assert info["admissible_actions"] == ["click[back to search]"] and not info["invalid_action"]


@pytest.mark.parametrize(
    "setup, action",
    [
        ([], "click[nonexistent]"),
        ([], "foo"),
        ([], ""),
        ([], "search[]"),
        (["search[cotton t-shirt]"], "search[cotton t-shirt]"),  # search only on the search page
        (["search[cotton t-shirt]"], "click[< prev]"),  # no previous page on page 1
        (["search[cotton t-shirt]", "ITEM"], "search[]"),
        (["search[cotton t-shirt]", "ITEM"], "search[shirt]"),
        (["search[cotton t-shirt]", "ITEM"], "click[B0NOSUCH]"),
        (["search[cotton t-shirt]", "ITEM", "click[buy now]"], "click[back to search]"),  # after the episode
    ],
)
def test_invalid_actions_leave_state_unchanged(env: ShopEnv, setup: list[str], action: str) -> None:
    obs, info = env.reset(seed=3, options={"split": "test"})
    for a in setup:
        if a == "ITEM":
            a = next(x for x in info["admissible_actions"] if x.startswith("click[b0"))
        obs, _, _, _, info = env.step(a)
    state = env.state
    next_obs, reward, terminated, _, next_info = env.step(action)
    assert next_obs == obs and env.state == state
    assert reward == 0.0 and next_info["reward"] == 0.0 and next_info["invalid_action"] and not terminated


def test_buy_ends_the_episode_with_the_formula_reward(env: ShopEnv) -> None:
    task = env.tasks("test")[0]
    env.reset(seed=0, options={"task": task})
    env.step(f"search[{task.instruction}]")
    asin = next(t for t, c in env.page.clicks.items() if c.kind == "item")
    env.step(f"click[{asin}]")
    product = env.product
    assert product is not None
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    expected = purchase_reward(ShopGoal.from_dict(task.goal), product, {})
    assert terminated and not truncated and reward == pytest.approx(expected.total)
    assert info["reward"] == reward and info["success"] == expected.success and info["admissible_actions"] == []
    assert info["purchase"]["asin"] == product.asin and f"{reward:.2f}" in obs


def test_step_limit_truncates(env: ShopEnv) -> None:
    short = ShopEnv(num_products=N, num_tasks_per_split=50, max_steps=3)
    short.reset(seed=0, options={"split": "test"})
    assert short.step("search[coffee]")[3] is False
    assert short.step("foo")[3] is False  # invalid actions count as steps too
    _, _, terminated, truncated, _ = short.step("click[next >]")
    assert truncated and not terminated


def test_same_seed_and_actions_give_same_observations() -> None:
    def play(seed: int) -> list[str]:
        shop = ShopEnv(num_products=N, num_tasks_per_split=50)
        return [t.next_state for t in run_episode(shop, shop.scripted_policy("random", seed=1), seed=seed).transitions]

    assert play(5) == play(5)
    a, b = ShopEnv(num_products=N, num_tasks_per_split=50), ShopEnv(num_products=N, num_tasks_per_split=50)
    assert a.reset(seed=9)[1]["admissible_actions"] == b.reset(seed=9)[1]["admissible_actions"]


def test_bad_constructor_and_policy_arguments(env: ShopEnv) -> None:
    with pytest.raises(ValueError, match="results_per_page"):
        ShopEnv(num_products=N, results_per_page=0)
    with pytest.raises(ValueError, match="no scripted policy"):
        env.scripted_policy("greedy")
    with pytest.raises(ValueError, match="noise"):
        env.scripted_policy("noisy", noise=1.5)
    with pytest.raises(ValueError, match="bad arguments"):
        env.scripted_policy("oracle", temperature=1.0)
    with pytest.raises(ValueError, match="unknown category"):
        env.reset(options={"task": {"task_id": "x", "instruction": "buy", "goal": {"category": "boat"}}})


# -- policies ---------------------------------------------------------------------------------------


def test_policies_on_the_default_shop() -> None:
    shop = make("shop")
    oracle = evaluate_scripted(shop, shop.scripted_policy("oracle"), 100)
    random_ = evaluate_scripted(shop, shop.scripted_policy("random", seed=0), 100)
    noisy = evaluate_scripted(shop, shop.scripted_policy("noisy", seed=0), 100)
    assert oracle.success_rate >= 0.95 and oracle.invalid_action_rate == 0.0
    assert random_.success_rate < 0.1
    assert 0.3 < noisy.success_rate < 1.0  # a mix of successes and failures
    traj = run_episode(shop, shop.scripted_policy("noisy", seed=0), split="test", seed=0)
    assert all(len(line) <= 100 for t in traj.transitions for line in t.next_state.splitlines())


def test_100k_catalog_builds() -> None:
    start = time.perf_counter()
    catalog = build_catalog.__wrapped__(100_000, 0)
    engine = SearchEngine(catalog)
    assert len(catalog) == 100_000 and len({p.asin for p in catalog.products}) == 100_000
    assert len(engine.search("organic coffee vanilla", k=50)) == 50
    print(f"100k catalog + BM25 index: {time.perf_counter() - start:.1f} s")


def test_gymnasium_make_passes_gymnasiums_checker() -> None:
    import gymnasium
    import pytest
    from conftest import gym_check

    gym_check("shop", num_products=100)
    with pytest.raises(ValueError, match="render_mode"):
        gymnasium.make("dreamgym/shop-v0", render_mode="rgb_array", num_products=100)
