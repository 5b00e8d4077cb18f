"""The fidelity report's code-judged shop checks, step selection, side-by-side view and LLM-judge parsing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.envs.shop.catalog import Product
from dreamgym.envs.shop.fidelity import (
    Check,
    bought,
    check_steps,
    click_check,
    consistency_report,
    elements,
    item_on_page,
    item_options_check,
    option_check,
    purchase_page_check,
    reward_check,
)
from dreamgym.envs.shop.pages import ShopState, ShopStateMapper, build_page
from dreamgym.envs.shop.reward import ShopGoal, purchase_reward
from dreamgym.experience.fidelity import (
    format_side_by_side,
    heldout_steps,
    judge_transitions,
    parse_judgement,
    side_by_side,
)
from dreamgym.experience.metrics import FidelityRecord
from dreamgym.experience.protocol import ExperiencePrediction, failure_prediction
from dreamgym.llm.base import Completion, Prompt, SamplingParams
from dreamgym.rl.wm2real import wm2real
from dreamgym.types import DataError, Task, Trajectory, Transition

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


def item_page(shop, product: Product, selected: Sequence[tuple[str, str]] = ()) -> str:
    """The real item page of ``product`` with ``selected`` options, as the shop renders it."""
    state = ShopState("item", item=shop.catalog.index_of(product.asin), selected=tuple(selected))
    return ShopStateMapper()(build_page(state, shop.catalog, 5), {})


def test_item_options_check_needs_the_products_own_options_not_just_its_title(shop) -> None:
    product = shop.catalog.products[3]
    other = next(p for p in shop.catalog.products if p.category == product.category and p.options != product.options)
    results = f"[1] text: Page 1 (results 1-5 of 50)\n[2] link: {product.asin} — {product.title} | ${product.price:.2f}"
    click = f"click[{product.asin.lower()}]"
    real = item_page(shop, product)
    assert click_check(results, click, real).ok and item_options_check(shop.catalog, results, click, real) == Check(True)
    # The right title and price with another product's options (what a model that copies only the clicked link
    # writes): click_check passes it, the options check does not.
    header = [line for line in real.splitlines() if " option: " not in line and "] button:" not in line]
    others = [line for line in item_page(shop, other).splitlines() if " option: " in line]
    made_up = "\n".join([*header, *others])
    assert click_check(results, click, made_up).ok
    verdict = item_options_check(shop.catalog, results, click, made_up)
    assert verdict is not None and not verdict.ok and verdict.reason in {"wrong_option_values", "wrong_option_count"}
    dropped = "\n".join(line for line in real.splitlines() if line != next(x for x in real.splitlines() if "option:" in x))
    assert item_options_check(shop.catalog, results, click, dropped) == Check(False, "wrong_option_count")
    assert item_options_check(shop.catalog, results, "click[next >]", real) is None  # not a product click
    unknown = results.replace(product.asin, "B0ZZZZZZ")
    assert item_options_check(shop.catalog, unknown, "click[b0zzzzzz]", real) is None  # not in this catalog


def test_reward_check_grounds_the_dreamt_reward_in_the_real_purchase(shop) -> None:
    target = shop.catalog.products[0]
    name, values = target.options[0]
    goal = ShopGoal(target.category, tuple(target.attributes[:2]), {name: values[0]}, target.price + 1.0, target.asin)
    claim = (f"[1] text: Thank you for shopping! You bought {target.asin} ({name}={values[0]})\n"
             "[2] text: Your score (min 0.0, max 1.0): 1.00")
    # Bought a wrong product; the dreamt page says the target was bought and the reward 1.0 agrees with that page
    # (what the check used to compare), but not with the real purchase.
    wrong = next(p for p in shop.catalog.products if p.category != target.category)
    real = item_page(shop, wrong)
    expected = round(purchase_reward(goal, wrong, {}).total, 2)
    assert expected < 0.5 and round(purchase_reward(goal, target, {name: values[0]}).total, 2) == 1.0
    assert reward_check(goal, shop.catalog, real, 1.0) == Check(False, "reward_differs")
    assert purchase_page_check(real, claim) == Check(False, "wrong_product")
    # A faithful answer: the real reward, and a done page naming what was really bought.
    faithful = f"[1] text: Thank you for shopping! You bought {wrong.asin} (no options)"
    assert reward_check(goal, shop.catalog, real, expected).ok and purchase_page_check(real, faithful).ok
    # The options selected on the real page count: the target with the goal's option earns 1.0, without it less.
    chosen, unselected = item_page(shop, target, [(name, values[0])]), item_page(shop, target)
    assert item_on_page(chosen) == (target.asin, {name: values[0]})
    assert reward_check(goal, shop.catalog, chosen, 1.0).ok and purchase_page_check(chosen, claim).ok
    assert reward_check(goal, shop.catalog, unselected, 1.0) == Check(False, "reward_differs")
    assert purchase_page_check(unselected, claim) == Check(False, "wrong_options")
    assert purchase_page_check(chosen, chosen) == Check(False, "no_purchase_page")
    # A real state that is no item page of this shop is bad data, not a model error.
    for bad in (RESULTS, real.replace(wrong.asin, "B0ZZZZZZ")):
        with pytest.raises(DataError):
            reward_check(goal, shop.catalog, bad, 1.0)


def test_consistency_report_on_real_trajectories_with_perfect_and_wrong_answers(shop) -> None:
    trajs = list(iter_episodes(shop, shop.scripted_policy("noisy", seed=0, noise=0.3), 12, split="test", seed=5))
    perfect = [(tr, t, ExperiencePrediction(None, x.next_state, x.reward, x.done, False))
               for tr in trajs for t, x in enumerate(tr.transitions)]
    report = check_steps(perfect)
    assert report["click_consistency"] == 1.0 and report["reward_consistency"] == 1.0
    assert report["zero_reward_consistency"] == 1.0 and report["item_options_consistency"] == 1.0
    assert report["consistency_checks"]["click"]["n"] > 0 and report["consistency_checks"]["reward"]["n"] > 0
    # The same answers with every reward shifted: each purchase is now inconsistent, and so is every other step.
    shifted = [(tr, t, ExperiencePrediction(None, p.next_state, 0.5 if p.reward != 0.5 else 0.25, p.done, False))
               for tr, t, p in perfect]
    report = check_steps(shifted)
    assert report["reward_consistency"] == 0.0 and report["zero_reward_consistency"] == 0.0
    assert report["click_consistency"] == 1.0
    assert report["purchase_page_consistency"] == 1.0  # the pages are the real ones
    assert consistency_report([])["click_consistency"] is None  # nothing applicable: no rate, not 0 or 1
    # Unparsable answers fail every check that applies, even where the served failure state (state unchanged,
    # reward 0) would pass one: a non-purchase step with reward 0.
    failed = [(tr, t, failure_prediction(tr.transitions[t].state, "no_next_state")) for tr, t, _ in perfect]
    report = check_steps(failed)
    for name in ("click", "item_options", "option", "reward", "purchase_page", "zero_reward"):
        assert report[f"{name}_consistency"] == 0.0, name
        assert report["consistency_checks"][name]["failures"] == {"invalid_output": report["consistency_checks"][name]["n"]}
    served = [(tr, t, replace(p, failure=None)) for tr, t, p in failed]
    assert check_steps(served)["zero_reward_consistency"] == 1.0  # what the fallback would have scored


def dreamt_episode(task: Task, actions: Sequence[str], reward: float, success: bool, rejected: Sequence[int] = (),
                   seed: int = 0) -> Trajectory:
    """A dreamt episode: only its actions, the dream's invalid flags and how it ended matter to wm2real."""
    steps = [Transition(state="[1] text: dreamt", action=a, next_state="[1] text: dreamt", reward=0.0, done=False,
                        info={"invalid_action": i in rejected}) for i, a in enumerate(actions)]
    steps[-1] = steps[-1].model_copy(update={"reward": reward, "done": True})
    return Trajectory(task=task, transitions=steps, success=success, source="synthetic", meta={"seed": seed})


def test_wm2real_matches_a_hand_computed_real_replay(shop) -> None:
    task = shop.tasks("test")[0]
    goal = ShopGoal.from_dict(task.goal)
    assert goal.asin is not None
    target = shop.catalog.get(goal.asin)
    search = f"search[{target.title}]"
    shop.reset(seed=0, options={"task": task})
    results = shop.step(search)[0]
    links = [text.split(" — ", 1)[0] for kind, text in elements(results) if kind == "link"]
    assert target.asin in links
    wrong = next(shop.catalog.get(a) for a in links if purchase_reward(goal, shop.catalog.get(a), {}).total < 0.9)
    r_wrong = purchase_reward(goal, wrong, {}).total  # by hand: the real reward of buying it without options
    right = [search, f"click[{target.asin.lower()}]", *(f"click[{v}]" for v in goal.options.values()), "click[buy now]"]
    bad_task = Task(task_id="bad", instruction="?", env="shop", goal={"category": "spaceship"})
    episodes = [
        dreamt_episode(task, right, 1.0, True),  # faithful: agrees
        dreamt_episode(task, [search, f"click[{wrong.asin}]", "click[buy now]"], 1.0, True),  # dreamt the target
        dreamt_episode(task, [search, f"click[{wrong.asin}]", "click[buy now]"], r_wrong, False),  # honest: agrees
        dreamt_episode(task, [*right, "click[back to search]"], 0.0, False),  # the real episode ends at the buy
        dreamt_episode(task, [search, "click[b0zzzzzz]", "click[buy now]"], 1.0, True),  # no such link in real
        dreamt_episode(task, [search, "click[buy now]"], 0.0, False, rejected=[0]),  # the dream rejected the search
        dreamt_episode(bad_task, ["click[buy now]"], 1.0, True),  # the real shop cannot play this task
    ]
    out = wm2real(episodes, lambda: make("shop", num_products=100))
    assert out["episodes"] == 6 and out["unreplayable"] == 1
    assert out["reward_agreement"] == pytest.approx(2 / 6) and out["success_agreement"] == pytest.approx(2 / 6)
    assert (out["real_ended_early"], out["invalid_in_real"], out["rejected_in_dream"], out["diverged"]) == (1, 1, 1, 3)
    assert out["real_success_rate"] == pytest.approx(2 / 6)  # the faithful episode and the one that ran on
    assert out["dreamt_success_rate"] == pytest.approx(3 / 6)
    assert out["real_mean_final_reward"] == pytest.approx((1.0 + r_wrong + r_wrong + 1.0 + 0.0 + 0.0) / 6)
    assert out["real_steps"] == len(right) + 3 + 3 + len(right) + 2 + 1
    with pytest.raises(ValueError):
        wm2real([], lambda: make("shop", num_products=100))


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


class PageLLM:
    """Answers every step with one fixed page."""

    def __init__(self, page: str) -> None:
        self.text = f"<state>\n{page}\n</state>\n<reward>0.00</reward> <done>0</done> <success>0</success>"

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        return [Completion(text=self.text, token_ids=[], finish_reason="stop") for _ in prompts]

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
        raise NotImplementedError


def test_the_report_counts_dreamt_pages_that_list_an_element_twice(shop) -> None:
    """Token F1 barely moves when a page lists one element twice; the report counts such pages beside the real ones."""
    from dreamgym.experience.fidelity import evaluate_experience_model, format_report
    from dreamgym.experience.model import ExperienceConfig, ExperienceModel
    from dreamgym.experience.protocol import ProtocolConfig

    trajs = list(iter_episodes(shop, shop.scripted_policy("noisy", seed=0), 2, split="test", seed=0))
    cfg = ExperienceConfig.from_protocol(ProtocolConfig(k=0, reasoning=False))
    twice = evaluate_experience_model(ExperienceModel(PageLLM(ITEM + "\n[10] button: Buy Now"), cfg), trajs)
    once = evaluate_experience_model(ExperienceModel(PageLLM(ITEM), cfg), trajs)
    assert twice["repeated_element_rate"] == 1.0 and once["repeated_element_rate"] == 0.0
    assert twice["repeated_element_real_rate"] == once["repeated_element_real_rate"] == 0.0
    assert "repeated_element_rate (valid pages)" in format_report(twice)
