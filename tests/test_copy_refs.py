"""Copy references (ProtocolConfig.copy_refs): targets point at prompt text, the parser writes it back in."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.experience.copyrefs import RefContext, encode_inline, encode_refs, expand_inline, expand_refs
from dreamgym.experience.model import ExperienceConfig, ExperienceModel
from dreamgym.experience.protocol import (
    ExperienceQuery,
    Neighbour,
    ProtocolConfig,
    parse_output,
    ref_context,
    step_target,
)
from dreamgym.llm.base import Completion, Prompt, SamplingParams

REFS = ProtocolConfig(k=1, reasoning=False, copy_refs=True)
RESULTS = "\n".join([
    "[1] text: Page 1 (results 1-3 of 9)",
    "[2] button: Back to Search",
    "[3] link: B0N38ATR — Torzu Cotton Bed Sheets, Breathable | $42.37",
    "[4] link: B0DBWC7J — Mono Cotton Bed Sheets | $74.32",
])
ITEM = "\n".join([
    "[1] text: B0N38ATR — Torzu Cotton Bed Sheets, Breathable",
    "[2] text: Price: $42.37",
    "[3] option: color=red",
    "[4] button: Buy Now",
])


def query(state: str, action: str, neighbour_next: str | None = None) -> ExperienceQuery:
    retrieved = [Neighbour("s", "a", neighbour_next, 0.0, False)] if neighbour_next else []
    return ExperienceQuery("find cotton sheets", [], retrieved, state, action)


def test_a_click_points_at_the_named_element_and_an_unchanged_page_is_one_range() -> None:
    q = query(RESULTS, "click[b0n38atr]")
    ctx = ref_context(q, REFS)
    encoded = encode_refs(ITEM, ctx)
    assert encoded.splitlines()[:2] == ["[1] text: @T.1 — @T.2", "[2] text: Price: @T.3"]
    assert expand_refs(encoded, ctx) == ITEM
    assert encode_refs(RESULTS, ctx) == "@1-"  # the state unchanged (an invalid action): to the end
    assert expand_refs("@1-2\n@3-", ctx) == RESULTS
    assert encode_inline("Back to Search", ctx) == "Back to Search"  # a layout word: written, not pointed at
    assert encode_inline('open [3] B0N38ATR "Torzu Cotton Bed Sheets, Breathable"', ctx) == 'open [3] @T.1 "@T.2"'


def test_a_neighbours_next_state_is_pointed_at_by_line() -> None:
    q = query("[1] searchbox: search[your query]", "search[cotton sheets]", neighbour_next=RESULTS)
    ctx = ref_context(q, REFS)
    assert encode_refs(RESULTS, ctx) == "@n1:1-"
    # a page sharing only some lines with the neighbour (its header) is written out, not started at line 4
    other = "\n".join([*RESULTS.splitlines()[:3], "[4] link: B0OTHER1 — Another Item | $1.00"])
    assert encode_refs(other, ctx) == other
    assert expand_refs("@n1:2-3", ctx) == "\n".join(RESULTS.splitlines()[1:3])


def test_encoding_round_trips_on_every_step_of_real_shop_episodes() -> None:
    shop = make("shop", num_products=100)
    trajs = list(iter_episodes(shop, shop.scripted_policy("noisy", seed=0), 30, split="train", seed=0))
    shorter = 0
    for traj in trajs:
        for t, x in enumerate(traj.transitions):
            q = ExperienceQuery.at_step(traj, t)
            target = step_target(traj, t, None, REFS, q)
            parsed = parse_output(target, REFS, query=q)
            assert parsed.prediction is not None, parsed.reason
            assert parsed.prediction.next_state == x.next_state.strip()
            shorter += len(target) < len(step_target(traj, t, None, REFS.model_copy(update={"copy_refs": False})))
    assert shorter > 0.5 * sum(len(t.transitions) for t in trajs)  # the point: most targets get shorter


def test_literal_at_signs_and_reference_lookalikes_survive_the_round_trip() -> None:
    rng = random.Random(0)
    pieces = ["@", "@1", "@T.0", "@@", "@n1:2", "x@y.com", "B0N38ATR", "Price: $42.37", "—", " | ", "@3-4", "\n"]
    ctx = RefContext.of(RESULTS, "[3] link: B0N38ATR — Torzu Cotton Bed Sheets, Breathable | $42.37", (ITEM,))
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))).strip() or "x"
        assert expand_refs(encode_refs(text, ctx), ctx) == "\n".join(text.splitlines()), text
        assert expand_inline(encode_inline(text, ctx), ctx) == text


@pytest.mark.parametrize("output", ["@9", "@n1:1", "@2-7", "@5-", "[1] text: @T.0", "[1] text: @7.1", "[1] text: @1.5"])
def test_a_reference_to_nothing_is_a_counted_bad_ref(output: str) -> None:
    q = query(RESULTS, "click[nothing here]")  # no TARGET line, no neighbour
    text = f"<state>\n{output}\n</state>\n<reward>0.00</reward> <done>0</done> <success>0</success>"
    assert parse_output(text, REFS, query=q).reason == "bad_ref"
    assert parse_output(text, REFS).reason == "bad_ref"  # no query to point into: counted, never raised
    assert parse_output(text, REFS.model_copy(update={"copy_refs": False}), query=q).ok  # plain text otherwise


def test_step_target_with_copy_refs_needs_the_query() -> None:
    shop = make("shop", num_products=50)
    traj = next(iter_episodes(shop, shop.scripted_policy("oracle", seed=0), 1, split="train", seed=0))
    with pytest.raises(ValueError, match="query"):
        step_target(traj, 0, None, REFS)


class EchoRefsLLM:
    """Answers every step with 'the page unchanged' in reference form."""

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        text = "<state>\n@1-4\n</state>\n<reward>0.00</reward> <done>0</done> <success>0</success>"
        return [Completion(text=text, token_ids=[], finish_reason="stop") for _ in prompts]

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
        raise NotImplementedError


def test_the_experience_model_serves_expanded_states() -> None:
    model = ExperienceModel(EchoRefsLLM(), ExperienceConfig.from_protocol(REFS.model_copy(update={"k": 0})))
    short = query("[1] text: only one line", "click[x]")
    full, bad = model.predict([query(RESULTS, "click[x]"), short])
    assert full.next_state == RESULTS and full.failure is None
    assert bad.failure == "bad_ref" and bad.next_state == short.state  # served the failure state, counted
    assert model.stats.failures["bad_ref"] == 1
    assert "@3-7" in REFS.system_text()  # an instruct model is told the scheme
