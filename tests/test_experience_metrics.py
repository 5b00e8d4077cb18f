"""Fidelity metrics of the experience model on hand-made cases and on real shop pages."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from dreamgym.envs import make
from dreamgym.envs.base import RandomPolicy, page_type_of
from dreamgym.envs.shop.pages import page_type
from dreamgym.experience.metrics import (
    FidelityRecord,
    element_set_match,
    fidelity_report,
    finite_horizon_bound,
    lemma1_bound,
    next_state_exact,
    state_token_f1,
)
from dreamgym.experience.protocol import ExperiencePrediction, failure_prediction
from dreamgym.types import Transition


def test_state_token_f1_hand_values() -> None:
    assert state_token_f1("a b c", "a b d") == pytest.approx(2 / 3)  # P = R = 2/3
    assert state_token_f1("a a", "a") == pytest.approx(2 / 3)  # multiset: P = 1/2, R = 1
    assert state_token_f1("a b", "a b c d") == pytest.approx(2 * 1 * 0.5 / 1.5)  # P = 1, R = 1/2
    assert state_token_f1("x y", "a b") == 0.0
    assert state_token_f1("[1]  text:\nhi", "[1] text: hi") == 1.0  # whitespace-insensitive, order-free
    assert state_token_f1("Hi", "hi") == 0.0  # case-sensitive: ids and titles must be copied exactly
    assert (
        state_token_f1("", "  ") == 1.0 and state_token_f1("", "a") == 0.0 and state_token_f1("a", "") == 0.0
    )


def test_element_set_and_exact_match() -> None:
    gold = "[1] text: Page 1\n[2] button: Next >"
    swapped = "\n[2] button: Next >  \n\n[1] text: Page 1"
    assert element_set_match(swapped, gold) and not next_state_exact(swapped, gold)
    assert next_state_exact("  [1] text: Page 1\n\n[2] button: Next >\n", gold)
    assert not element_set_match("[1] text: Page 1", gold)
    assert not element_set_match("[1] text: Page 2\n[2] button: Next >", gold)
    assert element_set_match("", "\n \n")


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        ("[1] searchbox: search[your query]", "search"),
        (
            "[1] text: Page 1 (results 1-5 of 9)\n[2] button: Back to Search\n[3] link: B0X — Shirt | $2.00",
            "results",
        ),
        ('[1] text: No results for "zzz"\n[2] button: Back to Search', "results"),
        ("[1] text: B0X — Shirt\n[2] text: Price: $2.00\n[3] option: size=m\n[4] button: Buy Now", "item"),
        (
            "[1] text: A soft shirt.\n[2] text: Wash cold!\n[3] button: < Prev\n[4] button: Back to Search",
            "description",
        ),
        ("[1] text: Cotton\n[2] text: Red\n[3] button: < Prev\n[4] button: Back to Search", "features"),
        (
            "[1] text: Thank you for shopping! You bought B0X\n[2] text: Your score (min 0.0, max 1.0): 0.50",
            "done",
        ),
        ("You are in the middle of a room.", "other"),
    ],
)
def test_page_type_rules(state: str, kind: str) -> None:
    assert page_type(state) == kind


def test_page_types_come_from_the_env_spec() -> None:
    assert page_type_of("shop") is page_type  # the shop's EnvSpec.page_type
    assert page_type_of("textworld")("[c1] command: look") == "state"  # an env without one: one kind
    assert fidelity_report([FidelityRecord(gold("[1] link: B0X"), pred("[1] link: B0X"))]).transitions_by_page == {
        "state": 1}


def test_page_type_agrees_with_the_shop_env() -> None:
    env = make("shop", num_products=200, num_tasks_per_split=20)
    policy, seen = RandomPolicy(seed=0), set()
    for episode in range(30):
        obs, info = env.reset(seed=episode)
        policy.reset(env, info["task"])
        assert page_type(obs) == info["page"]
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(policy.act(obs, info))
            assert page_type(obs) == info["page"], obs
            seen.add(info["page"])
            done = terminated or truncated
    assert seen == {"search", "results", "item", "description", "features", "done"}


def test_lemma1_hand_values() -> None:
    # 0.1 / 0.1 + 2 * 0.9 * 1 * 0.05 / 0.01 = 1 + 9
    assert lemma1_bound(0.1, 0.05, gamma=0.9) == pytest.approx(10.0)
    assert lemma1_bound(0.1, 0.05, gamma=0.9, r_max=2.0) == pytest.approx(19.0)
    assert lemma1_bound(0.0, 0.0, gamma=0.5) == 0.0 and math.isinf(lemma1_bound(0.1, 0.0, gamma=1.0))
    with pytest.raises(ValueError):
        lemma1_bound(0.1, 0.1, gamma=1.5)
    # Finite horizon: H eps_R + R_max eps_P H (H - 1); capped return-to-go: sum of min(v_max, (H-1-t) R_max).
    assert finite_horizon_bound(0.1, 0.05, horizon=3) == pytest.approx(0.3 + 0.05 * 3 * 2)
    for horizon in range(8):
        closed = horizon * 0.1 + 0.05 * horizon * (horizon - 1)
        assert finite_horizon_bound(0.1, 0.05, horizon) == pytest.approx(closed)
    assert finite_horizon_bound(0.1, 0.05, horizon=3, v_max=1.0) == pytest.approx(
        0.3 + 2 * 0.05 * (1 + 1 + 0)
    )


def gold(next_state: str, reward: float = 0.0, done: bool = False) -> Transition:
    return Transition(state="[1] text: s", action="click[x]", next_state=next_state, reward=reward, done=done)


def pred(
    next_state: str, reward: float = 0.0, done: bool = False, success: bool = False
) -> ExperiencePrediction:
    return ExperiencePrediction("r", next_state, reward, done, success)


def test_fidelity_report_hand_case() -> None:
    results = "[1] text: Page 1 (results 1-1 of 1)\n[2] link: B0X — Shirt | $2.00"
    item = "[1] text: B0X — Shirt\n[2] option: size=m\n[3] button: Buy Now"
    done = "[1] text: Thank you for shopping!\n[2] text: Your score (min 0.0, max 1.0): {:.2f}"
    records = [
        FidelityRecord(gold(results), pred(results)),  # exact
        FidelityRecord(gold(item), pred("\n".join(reversed(item.splitlines())))),  # same set, other order
        FidelityRecord(gold(item), failure_prediction("[1] text: s", "bad_reward")),  # invalid output
        FidelityRecord(gold(done.format(1), 1.0, True), pred(done.format(1), 0.95, True, True)),  # within 0.1
        FidelityRecord(gold(done.format(1), 1.0, True), pred(done.format(1), 1.0, True, True)),
        FidelityRecord(gold(done.format(1), 1.0, True), pred(done.format(1), 1.0, False)),  # done wrong
        FidelityRecord(
            gold(done.format(0.5), 0.5, True), pred(done.format(1), 1.0, True, True)
        ),  # reward off 0.5
    ]
    report = fidelity_report(records, gamma=0.9, horizon=3, page_type=page_type)
    assert report.transitions == 7 and report.terminal_transitions == 4
    # The invalid output is wrong everywhere, although its fallback (reward 0, not done) matches the real step.
    assert report.reward_accuracy == pytest.approx(5 / 7)
    assert report.terminal_reward_accuracy == pytest.approx(3 / 4)
    assert report.terminal_reward_exact_accuracy == pytest.approx(2 / 4)  # 0.95 is within 0.1, not exact
    assert report.terminal_reward_majority == 1.0
    assert report.terminal_reward_majority_baseline == pytest.approx(3 / 4)
    assert report.terminal_reward_exact_majority_baseline == pytest.approx(3 / 4)
    assert report.reward_majority == 0.0 and report.reward_majority_baseline == pytest.approx(3 / 7)
    assert report.done_majority is True and report.done_majority_baseline == pytest.approx(4 / 7)
    assert report.reward_mae == pytest.approx((0.05 + 0.5 + 1.0) / 7)  # the invalid output: an error of R_max
    assert report.done_accuracy == pytest.approx(5 / 7)
    assert report.invalid_output_rate == pytest.approx(1 / 7)
    assert report.invalid_output_reasons == {"bad_reward": 1}
    assert report.next_state_exact == pytest.approx(4 / 7)  # results, and three identical done pages
    assert report.next_state_set_match == pytest.approx(5 / 7)
    assert report.next_state_copy_baseline["exact"] == 0.0  # no real step left the state as it was
    assert report.epsilon_p == pytest.approx(2 / 7)
    assert report.transitions_by_page == {"done": 4, "item": 2, "results": 1}
    assert report.next_state_f1_by_page["results"] == 1.0
    assert report.next_state_f1_by_page["item"] == pytest.approx((1.0 + 0.0) / 2)
    assert report.epsilon_r["max"] == pytest.approx(1.0)
    assert report.epsilon_r["quantile"] == pytest.approx(1.0)  # q95 of 7 errors: the largest ("higher")
    assert report.epsilon_r["terminal_max"] == report.epsilon_r["terminal_quantile"] == pytest.approx(0.5)
    assert report.epsilon_r["terminal_mean"] == pytest.approx(0.55 / 4)
    assert report.epsilon_r["bound"] == pytest.approx(1.0)  # the larger of the two quantiles
    assert report.lemma1_bound == pytest.approx(lemma1_bound(1.0, 2 / 7, 0.9))
    assert report.finite_horizon_bound == pytest.approx(finite_horizon_bound(1.0, 2 / 7, 3, v_max=1.0))
    assert json.loads(json.dumps(report.as_dict()))["epsilon_p"] == pytest.approx(2 / 7)


def test_majority_baseline_and_edge_cases() -> None:
    terminal = [0.0, 0.0, 0.5, 0.5, 1.0]  # tie between 0.0 and 0.5: the smaller wins, deterministic
    records = [
        FidelityRecord(gold("[1] text: end", r, True), pred("[1] text: end", r, True, r == 1.0))
        for r in terminal
    ]
    report = fidelity_report(records)
    assert report.terminal_reward_majority == 0.0
    assert report.terminal_reward_majority_baseline == pytest.approx(2 / 5)
    assert report.terminal_reward_accuracy == 1.0 and report.epsilon_r["quantile"] == 0.0
    cut = Transition(
        state="s", action="a", next_state="[1] text: a", reward=0.0, done=True, info={"truncated": True}
    )
    truncated = fidelity_report(
        [FidelityRecord(cut, pred("[1] text: a"))]
    )  # a max_steps cut is not an ending
    assert truncated.terminal_transitions == 0 and truncated.done_accuracy == 1.0
    no_terminal = fidelity_report([FidelityRecord(gold("[1] text: a"), pred("[1] text: a"))])
    assert (
        no_terminal.terminal_reward_accuracy is None and no_terminal.terminal_reward_majority_baseline is None
    )
    assert no_terminal.epsilon_p == 0.0 and no_terminal.lemma1_bound == 0.0
    with pytest.raises(ValueError):
        fidelity_report([])
    with pytest.raises(ValueError):
        fidelity_report(records, quantile=2.0)


def test_epsilon_r_on_terminal_steps_sees_wrong_purchase_rewards() -> None:
    # The demo's case: 94% of the steps are non-terminal and exact, 14 of 19 purchase rewards are wrong.
    steps = [FidelityRecord(gold("[1] text: a"), pred("[1] text: a")) for _ in range(300)]
    purchases = [FidelityRecord(gold("[1] text: end", 1.0, True), pred("[1] text: end", 0.2 if i < 14 else 1.0, True))
                 for i in range(19)]
    report = fidelity_report(steps + purchases, gamma=0.9, horizon=3)
    assert report.terminal_transitions == 19 and report.epsilon_r["quantile"] == 0.0  # the all-steps quantile
    assert report.epsilon_r["max"] == pytest.approx(0.8)
    assert report.epsilon_r["terminal_quantile"] == pytest.approx(0.8)
    assert report.epsilon_r["terminal_mean"] == pytest.approx(14 * 0.8 / 19)
    assert report.epsilon_r["bound"] == pytest.approx(0.8)
    assert report.lemma1_bound == pytest.approx(lemma1_bound(0.8, 0.0, 0.9)) and report.lemma1_bound > 0
    assert report.terminal_reward_accuracy == pytest.approx(5 / 19)
    assert report.terminal_reward_majority_baseline == 1.0
    # All purchases right: the bound is 0 again.
    right = fidelity_report(steps + [FidelityRecord(r.gold, pred("[1] text: end", 1.0, True)) for r in purchases])
    assert right.epsilon_r["bound"] == 0.0 and right.lemma1_bound == 0.0


def test_an_all_unparsable_model_scores_zero_not_the_failure_states_score() -> None:
    # Real steps the served failure state (state unchanged, reward 0, not done) would match: invalid actions ...
    same = "[1] text: Page 1 (results 1-1 of 1)\n[2] link: B0X — Shirt | $2.00"
    invalid = [Transition(state=same, action="click[nothing]", next_state=same, reward=0.0, done=False)] * 8
    # ... and a purchase, so that every baseline is defined.
    bought = Transition(state="[1] button: Buy Now", action="click[buy now]", next_state="[1] text: Thank you",
                        reward=0.0, done=True)
    records = [FidelityRecord(x, failure_prediction(x.state, "no_next_state")) for x in [*invalid, bought]]
    report = fidelity_report(records, page_type=page_type)
    assert report.invalid_output_rate == 1.0
    for name in ("reward_accuracy", "terminal_reward_accuracy", "terminal_reward_exact_accuracy", "done_accuracy",
                 "next_state_exact", "next_state_set_match", "next_state_f1"):
        assert getattr(report, name) == 0.0, name
    assert report.next_state_f1_by_page == {"done": 0.0, "results": 0.0}
    assert report.epsilon_p == 1.0 and report.epsilon_r["max"] == 1.0 and report.epsilon_r["bound"] == 1.0
    # The baselines are not zero, and the failure state itself would have scored like copying the state.
    assert report.reward_majority_baseline == 1.0 and report.done_majority_baseline == pytest.approx(8 / 9)
    assert report.next_state_copy_baseline["exact"] == pytest.approx(8 / 9)
    served = fidelity_report([FidelityRecord(r.gold, replace(r.prediction, failure=None)) for r in records])
    assert served.reward_accuracy == 1.0 and served.next_state_exact == pytest.approx(8 / 9)  # what it scored before
