"""The reward head: it reads the task against the page (a head given another task's words loses what it gained over
the majority answer), it is reproducible and saved without pickle, and M_exp applies it only to the steps it ends."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.experience.model import ExperienceConfig, ExperienceModel
from dreamgym.experience.protocol import ExperienceQuery, format_target
from dreamgym.experience.reward_head import (
    FEATURES,
    HEAD_FILE,
    Ending,
    RewardHead,
    endings,
    grounding_features,
    quantities,
    task_bound,
    task_phrases,
)
from dreamgym.llm.base import Completion, Prompt, SamplingParams

ITEM = """[1] text: B0QUOZ2C — Torsa Built In Microphone Headphones, Foldable
[2] text: Price: $186.63
[3] option: color=white (selected)
[4] option: color=black
[5] button: Buy Now"""


def shop_endings(episodes: int, seed: int, split: str, noise: float) -> list[Ending]:
    shop = make("shop", val_fraction=0.1)
    policy = shop.scripted_policy("noisy", seed=seed, noise=noise)
    return endings(list(iter_episodes(shop, policy, episodes, split=split, seed=seed)))


@pytest.fixture(scope="module")
def fitted() -> tuple[RewardHead, list[Ending]]:
    train = shop_endings(600, 0, "train", 0.8)
    return RewardHead.fit(train, seed=0, steps=600), shop_endings(150, 100_000, "val", 0.8)


def accuracy(answers: Sequence[tuple[float, bool]], data: Sequence[Ending]) -> float:
    return float(np.mean([abs(r - e.reward) <= 0.1 + 1e-9 for (r, _), e in zip(answers, data, strict=True)]))


def test_the_head_beats_the_majority_answer_by_reading_the_task(fitted: tuple[RewardHead, list[Ending]]) -> None:
    head, val = fitted
    majority = Counter(round(e.reward, 2) for e in val).most_common(1)[0][0]
    baseline = accuracy([(majority, False)] * len(val), val)
    own = accuracy(head.predict_batch([(e.instruction, e.state) for e in val]), val)
    # the cheat: the same pages judged against another val task's words
    shifted = [val[(i + 1) % len(val)].instruction for i in range(len(val))]
    other = accuracy(head.predict_batch([(s, e.state) for s, e in zip(shifted, val, strict=True)]), val)
    assert own >= baseline + 0.15, (own, baseline)
    assert other <= baseline + 0.05, (other, baseline)


def test_the_head_is_seeded_and_round_trips_through_json(fitted: tuple[RewardHead, list[Ending]],
                                                         tmp_path: Path) -> None:
    head, val = fitted
    queries = [(e.instruction, e.state) for e in val]
    head.save(tmp_path)
    assert RewardHead.load(tmp_path).predict_batch(queries) == head.predict_batch(queries)
    data = json.loads((tmp_path / HEAD_FILE).read_text())
    assert data["summary"]["endings"] == head.summary["endings"] and data["values"] == head.summary["classes"]
    (tmp_path / HEAD_FILE).write_text(json.dumps({**data, "features": ["something else"]}))
    with pytest.raises(ValueError, match="invalid reward head"):
        RewardHead.load(tmp_path)
    older = {k: v for k, v in data.items() if k != "features_version"}  # saved before the version was recorded
    (tmp_path / HEAD_FILE).write_text(json.dumps(older))
    with pytest.raises(ValueError, match="features version 1"):
        RewardHead.load(tmp_path)
    with pytest.raises(ValueError, match="no reward head"):
        RewardHead.load(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=">= 2 real terminal steps"):
        RewardHead.fit(val[:1])


def test_features_see_a_selected_option_the_task_did_not_ask_for() -> None:
    common = frozenset({"i", "need", "in", "and", "price", "lower", "than", "dollars"})
    white = grounding_features("i need foldable headphones in white, and price lower than 200.00 dollars", ITEM, common)
    black = grounding_features("i need foldable headphones in black, and price lower than 200.00 dollars", ITEM, common)
    cheap = grounding_features("i need foldable headphones in white, and price lower than 100.00 dollars", ITEM, common)
    names = {name: i for i, name in enumerate(FEATURES)}
    assert white[names["in_marked"]] > 0 and black[names["in_marked"]] == 0
    assert black[names["only_in_sibling"]] > 0 and white[names["only_in_sibling"]] == 0
    over = FEATURES.index("number_over_bound")
    assert white[over] == 0 and cheap[over] == 1  # a page number over the task's bound


def test_the_bound_reads_the_pages_quantities_written_like_it_not_ids_or_sizes() -> None:
    """The task's bound ("10.00") is compared with the page's numbers written like it (a price "$57.78"), not with the
    digits of an id ("B04I0YS7") or a size ("1.7 oz", "30l"): read that way, every page was over a small bound and
    the head learned to ignore the price (the dream paid 1.0 for moisturisers at $57.78 under a $10.00 bound)."""
    common = frozenset({"i", "want", "a", "and", "price", "lower", "than", "dollars"})
    page = ("[1] text: B04I0YS7 — Mira Hyaluronic Acid Face Moisturizer\n[2] text: Price: $8.50\n"
            "[3] option: size=1.7 oz\n[4] option: size=30l\n[5] button: Buy Now")
    names = {name: i for i, name in enumerate(FEATURES)}
    under = grounding_features("i want a face moisturizer, and price lower than 10.00 dollars", page, common)
    assert under[names["number_over_bound"]] == 0 and under[names["number_to_bound"]] == pytest.approx(0.85)
    over = grounding_features("i want a face moisturizer, and price lower than 10.00 dollars",
                              page.replace("$8.50", "$57.78"), common)
    assert over[names["number_over_bound"]] == 1 and over[names["number_to_bound"]] == pytest.approx(4.0)  # capped
    assert quantities("B04I0YS7 costs $1,057.78 in size 30l or 1.7 oz") == [(1057.78, 2), (1.7, 1)]


def test_the_tasks_phrases_are_its_requirements_and_each_is_found_where_the_page_meets_it() -> None:
    """One phrase per requirement, the bound left out (the price, not a size written with fewer decimals), and each
    phrase met whole in the title, in a selected option, only in an option not selected, or nowhere: the counts the
    reward's formula is made of (2 of 4 met + the price = 3/5 here)."""
    common = frozenset({"i", "need", "and", "in", "size", "price", "lower", "than", "dollars"})
    task = "i need gluten free and low sugar protein bars in berry flavor and in size 33.8 fl oz, and price lower than 30.00 dollars"
    assert task_bound(task) is not None and task_bound(task).group(0) == "30.00"  # type: ignore[union-attr]
    assert task_phrases(task, common) == [frozenset({"gluten", "free"}), frozenset({"low", "sugar", "protein", "bars"}),
                                          frozenset({"berry", "flavor"}), frozenset({"33", "8", "fl", "oz"})]
    page = ("[1] text: B0KAI4SI — Tordeber Gluten Free Protein Bars, Low Sugar\n[2] text: Price: $20.71\n"
            "[3] option: flavor=chocolate (selected)\n[4] option: flavor=berry\n"
            "[5] option: size=12 count\n[6] option: size=33.8 fl oz (selected)\n[7] button: Buy Now")
    names = {name: i for i, name in enumerate(FEATURES)}
    x = grounding_features(task, page, common)
    counts = ("phrases", "phrases_in_first", "phrases_in_marked", "phrases_only_in_choice", "phrases_unoffered",
              "phrases_unseen")
    assert [x[names[k]] for k in counts] == [4, 2, 1, 1, 0, 0]
    assert x[names["phrase_score"]] == pytest.approx(4 / 5)  # 2 in the title + the size chosen + the price
    # a size the page does not offer is unmet for sure; a property the title does not show may be met off the page
    odd = grounding_features(task.replace("33.8 fl oz", "loveseat").replace("gluten free", "non gmo"), page, common)
    assert [odd[names[k]] for k in counts] == [4, 1, 0, 1, 1, 1]
    assert odd[names["phrase_score"]] == pytest.approx(2 / 5) and odd[names["phrase_score_unseen_met"]] == pytest.approx(3 / 5)
    over = grounding_features(task, page.replace("$20.71", "$40.71"), common)
    assert over[names["phrase_score"]] == pytest.approx(3 / 5)
    assert grounding_features("i need a backpack", page, common)[names["phrase_score"]] == 0.0  # no bound, no phrase met


class EndsWithOne:
    """An M_exp that ends every step with reward 1.0, or never ends one."""

    tokenizer = None

    def __init__(self, done: bool) -> None:
        self.done = done

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        text = format_target(ITEM, 1.0 if self.done else 0.0, self.done, self.done, "buy",
                             ExperienceConfig().protocol_config())
        return [Completion(text=text, token_ids=[], finish_reason="stop") for _ in prompts]

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
        raise NotImplementedError


def test_the_experience_model_asks_the_head_only_for_the_steps_it_ends(
        fitted: tuple[RewardHead, list[Ending]]) -> None:
    head, val = fitted
    wrong = next(e for e in val if head.predict(e.instruction, e.state)[0] < 1.0)
    query = ExperienceQuery(wrong.instruction, [], [], wrong.state, "click[buy now]")
    plain = ExperienceModel(EndsWithOne(True), ExperienceConfig())  # type: ignore[arg-type]
    assert plain.predict([query])[0].reward == 1.0 and "head_rewards" not in plain.stats_dict()
    with_head = ExperienceModel(EndsWithOne(True), ExperienceConfig(reward_head=True), reward_head=head)  # type: ignore[arg-type]
    pred = with_head.predict([query])[0]
    assert (pred.reward, pred.success) == head.predict(wrong.instruction, wrong.state) and not pred.success
    assert with_head.stats_dict() | {"head_rewards": 1, "head_changed_rewards": 1} == with_head.stats_dict()
    going_on = ExperienceModel(EndsWithOne(False), ExperienceConfig(reward_head=True), reward_head=head)  # type: ignore[arg-type]
    assert going_on.predict([query])[0].reward == 0.0 and going_on.head_rewards == 0
    with pytest.raises(ValueError, match="reward head"):
        ExperienceModel(EndsWithOne(True), ExperienceConfig(reward_head=True))  # type: ignore[arg-type]
