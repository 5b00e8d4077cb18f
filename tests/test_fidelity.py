"""The fidelity report's code-judged shop checks, step selection, side-by-side view and LLM-judge parsing."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.envs.shop.fidelity import (
    bought,
    check_steps,
    click_check,
    consistency_report,
    option_check,
    reward_check,
)
from dreamgym.envs.shop.reward import ShopGoal, purchase_reward
from dreamgym.experience.fidelity import (
    format_side_by_side,
    heldout_steps,
    judge_transitions,
    parse_judgement,
    side_by_side,
)
from dreamgym.experience.metrics import FidelityRecord
from dreamgym.experience.protocol import ExperiencePrediction
from dreamgym.llm.base import Completion, Prompt, SamplingParams

RESULTS = """[1] text: Page 1 (results 1-5 of 50)
[2] button: Back to Search
[3] button: Next >
[4] link: B0QH9VSU — Kazu Solid Wood Legs Sofa, Mid Century | $729.72
[5] link: B0B1LNJA — Tira Mid Century Sofa, Solid Wood Legs | $337.77"""

ITEM = """[1] text: B0B1LNJA — Tira Mid Century Sofa, Solid Wood Legs
[2] text: Price: $337.77
[3] option: color=navy
[4] option: color=black (selected)
[5] button: Description
[6] button: Features
[7] button: Buy Now
[8] button: < Prev
[9] button: Back to Search"""


@pytest.fixture(scope="module")
def shop():
    return make("shop", num_products=100)


def test_click_check_passes_the_clicked_product_and_fails_a_wrong_id_title_or_price() -> None:
    assert click_check(RESULTS, "click[b0b1lnja]", ITEM) is not None
    assert click_check(RESULTS, "click[b0b1lnja]", ITEM).ok  # type: ignore[union-attr]
    wrong_price = ITEM.replace("$337.77", "$337.70")
    wrong_id = ITEM.replace("B0B1LNJA", "B0QH9VSU")
    wrong_title = ITEM.replace("Tira Mid", "Tira Modern")
    assert click_check(RESULTS, "click[b0b1lnja]", wrong_price) == click_check(RESULTS, "click[B0B1LNJA]", wrong_price)
    assert [click_check(RESULTS, "click[b0b1lnja]", s).reason for s in (wrong_price, wrong_id, wrong_title)] == [  # type: ignore[union-attr]
        "wrong_price", "wrong_product", "wrong_title"]
    assert click_check(RESULTS, "click[next >]", ITEM) is None  # not a product click: not applicable
    assert click_check(ITEM, "click[b0b1lnja]", ITEM) is None  # no such link on the page


def test_option_check_wants_the_same_product_with_the_clicked_option_selected() -> None:
    good = ITEM.replace("color=navy", "color=navy (selected)").replace("color=black (selected)", "color=black")
    assert option_check(ITEM, "click[navy]", good).ok  # type: ignore[union-attr]
    assert option_check(ITEM, "click[navy]", ITEM).reason == "option_not_selected"  # type: ignore[union-attr]
    assert option_check(ITEM, "click[navy]", good.replace("$337.77", "$1.00")).reason == "wrong_product"  # type: ignore[union-attr]
    assert option_check(ITEM, "click[buy now]", good) is None
    assert option_check(RESULTS, "click[navy]", good) is None


def test_bought_parses_the_done_page() -> None:
    assert bought("[1] text: Thank you for shopping! You bought B0AB12CD (color=red, size=33.8 fl oz)\n"
                  "[2] text: Your score (min 0.0, max 1.0): 0.50") == ("B0AB12CD", {"color": "red", "size": "33.8 fl oz"})
    assert bought("[1] text: Thank you for shopping! You bought B0AB12CD (no options)") == ("B0AB12CD", {})
    assert bought(ITEM) is None


def test_reward_check_uses_the_shop_formula_on_the_dreamt_purchase(shop) -> None:
    product = shop.catalog.products[0]
    name, values = product.options[0]
    goal = ShopGoal(product.category, tuple(product.attributes[:2]), {name: values[0]}, product.price + 1.0)
    page = f"[1] text: Thank you for shopping! You bought {product.asin} ({name}={values[0]})"
    assert reward_check(goal, shop.catalog, page, 1.0).ok
    assert reward_check(goal, shop.catalog, page, 0.75).reason == "reward_differs"
    unselected = page.replace(f"({name}={values[0]})", "(no options)")
    expected = round(purchase_reward(goal, product, {}).total, 2)
    assert expected < 1.0 and reward_check(goal, shop.catalog, unselected, expected).ok
    assert not reward_check(goal, shop.catalog, unselected, 1.0).ok  # the dreamt page says the option was not chosen
    assert reward_check(goal, shop.catalog, page.replace(product.asin, "B0ZZZZZZ"), 1.0).reason == "unknown_product"
    assert reward_check(goal, shop.catalog, ITEM, 1.0).reason == "no_purchase_page"


def test_consistency_report_on_real_trajectories_with_perfect_and_wrong_answers(shop) -> None:
    trajs = list(iter_episodes(shop, shop.scripted_policy("noisy", seed=0, noise=0.3), 12, split="test", seed=5))
    perfect = [(tr, t, ExperiencePrediction(None, x.next_state, x.reward, x.done, False))
               for tr in trajs for t, x in enumerate(tr.transitions)]
    report = check_steps(perfect)
    assert report["click_consistency"] == 1.0 and report["reward_consistency"] == 1.0
    assert report["zero_reward_consistency"] == 1.0
    assert report["consistency_checks"]["click"]["n"] > 0 and report["consistency_checks"]["reward"]["n"] > 0
    # The same answers with every reward shifted: each purchase is now inconsistent, and so is every other step.
    shifted = [(tr, t, ExperiencePrediction(None, p.next_state, 0.5 if p.reward != 0.5 else 0.25, p.done, False))
               for tr, t, p in perfect]
    report = check_steps(shifted)
    assert report["reward_consistency"] == 0.0 and report["zero_reward_consistency"] == 0.0
    assert report["click_consistency"] == 1.0
    assert consistency_report([])["click_consistency"] is None  # nothing applicable: no rate, not 0 or 1


def test_heldout_steps_take_whole_trajectories_in_a_seeded_order(shop) -> None:
    trajs = list(iter_episodes(shop, shop.scripted_policy("noisy", seed=0), 6, split="test", seed=0))
    steps = heldout_steps(trajs, None, seed=0)
    assert len(steps) == sum(len(t.transitions) for t in trajs)
    assert heldout_steps(trajs, None, seed=0) == steps
    few = heldout_steps(trajs, 5, seed=1)
    assert len(few) == 5 and [t for _, t in few][:2] == [0, 1]


def test_side_by_side_marks_differing_lines() -> None:
    from dreamgym.types import Task, Trajectory, Transition

    gold = Transition(state=RESULTS, action="click[b0b1lnja]", next_state=ITEM, reward=0.0, done=False)
    traj = Trajectory(task=Task(task_id="t", instruction="a sofa"), transitions=[gold])
    dreamt = ExperiencePrediction("open it", ITEM.replace("$337.77", "$9.99"), 0.0, False, False)
    rows = side_by_side([FidelityRecord(gold, dreamt)], [(traj, 0)], n=3)
    text = format_side_by_side(rows)
    assert "*  [2] text: Price: $337.77" in text and "|  [2] text: Price: $9.99" in text
    assert "   [1] text: B0B1LNJA" in text  # an equal line is not marked


def test_parse_judgement_accepts_only_four_scores_in_0_1_2() -> None:
    good = '{"causal_consistency": 2, "diversity": 1, "informativeness": 0, "hallucination": 2}'
    assert parse_judgement(f"Sure! {good} done") == {"causal_consistency": 2, "diversity": 1, "informativeness": 0,
                                                    "hallucination": 2}
    for bad in ("", "no json here", good.replace("0", "3"), good.replace("2,", "true,"), good[:-1],
                '{"causal_consistency": 2}', good.replace("1", '"1"')):
        assert parse_judgement(bad) is None, bad


class ScriptedJudge:
    """A stand-in judge backend whose answers (good, malformed) are scripted: the parsing and counting of
    the judge mode are under test, not a model."""

    tokenizer: object | None = None

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.calls = 0

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        self.calls += 1
        return [Completion(text=self.answers.pop(0) if self.answers else "garbage", token_ids=[]) for _ in prompts]

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
        raise NotImplementedError


def test_judge_counts_unparsable_answers_and_averages_the_rest() -> None:
    from dreamgym.types import Transition

    gold = Transition(state=RESULTS, action="click[b0b1lnja]", next_state=ITEM, reward=0.0, done=False)
    records = [FidelityRecord(gold, ExperiencePrediction(None, ITEM, 0.0, False, False))] * 3
    good = '{"causal_consistency": 2, "diversity": 1, "informativeness": 2, "hallucination": 0}'
    judge = ScriptedJudge([good, "oops", good, "still bad"])  # 1st round: 3 answers; retry: 1 answer
    out = judge_transitions(judge, records, n=3, retries=1)
    assert judge.calls == 2
    assert out["judged"] == 2 and out["unparsable"] == 1 and out["causal_consistency"] == 2.0
    assert out["hallucination"] == 0.0
