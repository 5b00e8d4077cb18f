"""Checked verdicts: the shop's trace checker recomputes a purchase's checks from the text the trace compares."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from dreamgym.collect import iter_episodes
from dreamgym.envs import make, spec
from dreamgym.envs.shop.explain import explain_trajectory
from dreamgym.envs.shop.recheck import recheck_purchase
from dreamgym.experience.model import ExperienceConfig, ExperienceModel
from dreamgym.experience.protocol import ExperienceQuery, format_target
from dreamgym.llm.base import Completion, Prompt, SamplingParams
from dreamgym.types import ExperiencePrediction

ITEM = """[1] text: B0QUOZ2C — Torsa Built In Microphone Headphones, Foldable
[2] text: Price: $186.63
[3] option: color=black
[4] option: color=white
[5] button: Buy Now"""
DONE = "[1] text: Thank you for shopping! You bought B0QUOZ2C (no options)\n[2] text: Your score (min 0.0, max 1.0): 1.00"
ALL_YES = ("buy B0QUOZ2C; type headphones=headphones y; attr foldable title y; attr wireless unseen y; "
           "opt color=white sel y; price 186.63<=220.00 y; score 4/4=1.00 -> done")


def predict(trace: str, state: str = ITEM) -> ExperiencePrediction | None:
    return recheck_purchase(state, "click[buy now]", ExperiencePrediction(trace, DONE, 1.0, True, True))


@pytest.fixture(scope="module")
def purchases() -> list[tuple[str, str, str, str, float]]:
    """(state, action, trace, next state, reward) of every purchase of noisy-oracle episodes, rule-annotated."""
    shop = make("shop", num_products=200)
    out = []
    for noise, n in ((0.3, 60), (0.8, 200)):
        for traj in iter_episodes(shop, shop.scripted_policy("noisy", seed=1, noise=noise), n, seed=3):
            for x, trace in zip(traj.transitions, explain_trajectory(traj).reasoning, strict=True):
                if trace.startswith("buy"):
                    out.append((x.state, x.action, trace, x.next_state, x.reward))
    return out


def test_the_annotators_own_purchase_traces_are_left_as_they_are(purchases) -> None:
    rewards = {round(r, 2) for *_, r in purchases}
    assert len(purchases) > 40 and len(rewards) > 3 and any(r < 0.5 for r in rewards)  # purchases of every reward
    for state, action, trace, next_state, reward in purchases:
        checked = recheck_purchase(state, action, ExperiencePrediction(trace, next_state, reward, True, reward >= 1))
        assert checked is not None
        assert (checked.reasoning, checked.next_state) == (trace, next_state)
        assert checked.reward == pytest.approx(reward, abs=0.005) and checked.success == (reward >= 1 - 1e-9)


def test_a_trace_that_says_yes_to_everything_gets_the_real_score_from_its_own_operands(purchases) -> None:
    """What the checker adds: a model that copies the compared text right but answers every check "y" and 1.00
    (the majority answer) is scored as the shop scores, except where an attribute the item page does not show is
    missing (there the model's own verdict stands)."""
    fixed = 0
    for state, action, trace, next_state, reward in purchases:
        lazy = re.sub(r"score .* -> done$", "score 1/1=1.00 -> done", re.sub(r" n(?=;)", " y", trace))
        checked = recheck_purchase(state, action, ExperiencePrediction(lazy, next_state, 1.0, True, True))
        assert checked is not None
        if " unseen n" not in trace:
            assert checked.reward == pytest.approx(reward, abs=0.005) and checked.reasoning == trace
            fixed += reward < 0.99
    assert fixed >= 3  # purchases the lazy trace scored 1.00 that are not


def test_each_check_is_recomputed() -> None:
    checked = predict(ALL_YES)
    assert checked is not None  # white is not selected on the page: 3 of 4, not a success, and the page says so
    assert checked.reasoning == ALL_YES.replace("sel y", "sel n").replace("4/4=1.00", "3/4=0.75")
    assert (checked.reward, checked.success, checked.done) == (0.75, False, True)
    assert checked.next_state.endswith("Your score (min 0.0, max 1.0): 0.75")
    selected = ITEM.replace("color=white", "color=white (selected)")
    assert predict(ALL_YES, selected).reward == 1.0  # type: ignore[union-attr]
    other = predict(ALL_YES.replace("type headphones=headphones", "type headphones=phone case"), selected)
    assert other is not None and other.reward == 0.1 and "score 0.1*4/4=0.10" in (other.reasoning or "")
    assert predict(ALL_YES.replace("186.63<=220.00", "286.63<=220.00"), selected).reward == 0.75  # type: ignore[union-attr]
    # an attribute the title shows is met, whatever the model wrote; one it does not show keeps the model's verdict
    assert predict(ALL_YES.replace("foldable title y", "foldable unseen n"), selected).reward == 1.0  # type: ignore[union-attr]
    assert predict(ALL_YES.replace("wireless unseen y", "wireless title n"), selected).reward == 0.75  # type: ignore[union-attr]
    assert predict(ALL_YES.replace("wireless unseen y", "wireless title y"), selected).reasoning.count("unseen y") == 1  # type: ignore[union-attr]


def test_a_leading_goal_is_kept_and_the_purchase_after_it_is_checked() -> None:
    """A trace may start with the task's goal (benchmarks/goal_line.py); the checker reads past it."""
    goal = "want headphones; attr foldable; attr wireless; opt color=white; price <=220.00 | "
    checked = predict(goal + ALL_YES)
    assert checked is not None and checked.reasoning == goal + predict(ALL_YES).reasoning  # type: ignore[union-attr]
    assert checked.reward == 0.75
    assert predict(goal + "open [4] B0QUOZ2C -> item page") is None
    assert predict("want headphones; " + ALL_YES) is None  # no separator: not a goal, not a purchase


@pytest.mark.parametrize("trace", [
    None, "open [4] B0QUOZ2C -> item page", "buy B0QUOZ2C -> done", ALL_YES.replace("; price", "; cost"),
    ALL_YES.replace(" -> done", ""), ALL_YES.replace("186.63", "18.6.63"), "buy X; score 1/1=1.00 -> done",
])
def test_anything_else_is_not_a_purchase_it_reads(trace: str | None) -> None:
    assert predict(trace) is None  # type: ignore[arg-type]


class OneAnswerLLM:
    tokenizer = None

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        text = format_target(DONE, 1.0, True, True, ALL_YES, ExperienceConfig().protocol_config())
        return [Completion(text=text, token_ids=[], finish_reason="stop") for _ in prompts]

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
        raise NotImplementedError


def test_the_experience_model_serves_checked_verdicts_only_when_asked() -> None:
    assert spec("shop").load("trace_checker") is recheck_purchase
    query = ExperienceQuery("i need foldable headphones in white", [], [], ITEM, "click[buy now]")
    plain = ExperienceModel(OneAnswerLLM(), ExperienceConfig(env="shop"))  # type: ignore[arg-type]
    assert plain.predict([query])[0].reward == 1.0 and "checked_verdicts" not in plain.stats_dict()
    checked = ExperienceModel(OneAnswerLLM(), ExperienceConfig(env="shop", protocol={"checked_verdicts": True}))  # type: ignore[arg-type]
    assert checked.predict([query])[0].reward == 0.75
    assert checked.stats_dict() | {"checked_verdicts": 1, "recomputed_verdicts": 1} == checked.stats_dict()
    with pytest.raises(ValueError, match="trace_checker"):
        ExperienceModel(OneAnswerLLM(), ExperienceConfig(env="scienceworld", protocol={"checked_verdicts": True}))  # type: ignore[arg-type]
