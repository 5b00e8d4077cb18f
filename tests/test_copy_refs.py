"""Copy references (ProtocolConfig.copy_refs): targets point at prompt text, the parser writes it back in."""

from __future__ import annotations

import random
from collections.abc import Sequence
from types import SimpleNamespace

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


def test_a_shortened_prompts_target_points_only_at_what_it_shows() -> None:
    """layout_refs: a prompt that lost its neighbour is trained on a target that writes the neighbour's page out,
    and a served output is expanded against the prompt as served, so '@n1:...' there is a counted bad_ref (a model
    saved before layout_refs still expands it against the whole query, as it was trained)."""
    from dreamgym.experience.protocol import retarget, shorter_layouts

    search = query("[1] searchbox: search[your query]", "search[cotton sheets]", neighbour_next=RESULTS)
    full = format_refs_target(RESULTS, search, REFS)
    assert "@n1:1-" in full
    [no_neighbour, *_] = shorter_layouts(search, REFS)
    assert no_neighbour.k == 0
    assert retarget(full, search, REFS, REFS) == full  # the same layout: unchanged
    written = retarget(full, search, REFS, no_neighbour)
    assert written is not None and "@n1" not in written and RESULTS.splitlines()[2] in written
    assert parse_output(written, no_neighbour, query=search).prediction.next_state == RESULTS  # type: ignore[union-attr]
    assert parse_output(full, no_neighbour, query=search).reason == "bad_ref"
    old = REFS.model_copy(update={"layout_refs": False})
    assert retarget(full, search, old, no_neighbour) == full  # the rule before: pointed into the whole query
    assert ExperienceConfig(protocol={"copy_refs": True}).protocol_config().layout_refs is False  # saved models

    class Tight:  # a local backend whose budget leaves no room for the neighbour
        max_length = 10_000

        def encode(self, prompt: object) -> list[int]:
            return [0] * len(str(prompt))

        def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
            return [Completion(text=full, token_ids=[], finish_reason="stop") for _ in prompts]

    budget = len(str(ExperienceModel(Tight(), ExperienceConfig.from_protocol(no_neighbour)).prompt(search)))  # type: ignore[arg-type]
    for cfg, served in ((REFS, None), (old, RESULTS)):
        model = ExperienceModel(Tight(), ExperienceConfig.from_protocol(  # type: ignore[arg-type]
            cfg, prompt_budget=budget, max_resamples=0))
        [pred] = model.predict([search])
        assert model.shortened_prompts == 1
        assert (pred.next_state, pred.failure) == ((RESULTS, None) if served else (search.state, "bad_ref"))


def format_refs_target(next_state: str, q: ExperienceQuery, cfg: ProtocolConfig) -> str:
    from dreamgym.experience.protocol import format_target

    return format_target(encode_refs(next_state, ref_context(q, cfg)), 0.0, False, False, None, cfg)


def test_training_fits_each_prompt_with_the_target_its_layout_needs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """fit_examples takes the first layout whose prompt and re-encoded target both fit: a written-out target is longer,
    so a budget that fits the short prompt with '@n1:1-' but not with the page written out shortens further."""
    from dreamgym.experience.train import fit_examples
    from dreamgym.sft import SFTExample, encode_target

    class Chars:  # a tokenizer of one token per character (what encode_prompt / encode_target need)
        eos_token_id = 0

        def __call__(self, text: str, add_special_tokens: bool = False) -> SimpleNamespace:
            return SimpleNamespace(input_ids=[ord(c) % 250 + 1 for c in text])

    tok = Chars()
    search = ExperienceQuery("find cotton sheets", [("[1] searchbox: search[your query]", "search[sheets]")],
                             [Neighbour("s", "a", RESULTS, 0.0, False)], "[1] searchbox: search[your query]",
                             "search[cotton sheets]")
    cfg = REFS.model_copy(update={"history_window": 1, "system_prompt": ""})
    from dreamgym.experience.protocol import build_prompt_text, prompt_layouts, retarget

    full = format_refs_target(RESULTS, search, cfg)
    ex = SFTExample(build_prompt_text(search, cfg), full)
    layouts = list(prompt_layouts(search, cfg))
    n = [len(build_prompt_text(search, c)) for c in layouts]
    t = [len(encode_target(tok, retarget(full, search, cfg, c) or "")) for c in layouts]
    assert t[1] > t[0] and n[1] < n[0]  # no neighbour: a shorter prompt, a longer target
    assert t[2] == t[1] and n[2] < n[1]  # no history either: the same target
    [fitted], counts = fit_examples(tok, [(search, ex)], cfg, False, n[0] + t[0])
    assert fitted == ex and counts["shortened_prompts"] == 0
    # room for the prompt without its neighbour beside the short target, not beside the written-out one
    [fitted], counts = fit_examples(tok, [(search, ex)], cfg, False, n[1] + t[1] - 1)
    assert fitted == SFTExample(build_prompt_text(search, layouts[2]), retarget(full, search, cfg, layouts[2]))
    assert "@n1" not in fitted.target and counts == {"shortened_prompts": 1, "retargeted": 1, "unfit_prompts": 0}
    # the served budget is met first, with the layout's own target
    [fitted], counts = fit_examples(tok, [(search, ex)], cfg, False, n[0] + t[0], served_budget=n[0] - 1)
    assert fitted == SFTExample(build_prompt_text(search, layouts[1]), retarget(full, search, cfg, layouts[1]))


TW_STATE = "\n".join([
    "location: Kitchen",
    "[i1] carrying: a cookbook",
    "[c1] command: drop cookbook",
    "[c2] command: open fridge",
    "[c3] command: take red bell pepper from fridge",
])
TW_NEXT = "\n".join([
    "location: Kitchen",
    "[i1] carrying: a red bell pepper",
    "[i2] carrying: a cookbook",
    "[c1] command: drop cookbook",
    "[c2] command: drop red bell pepper",
    "[c3] command: open fridge",
])


def test_element_refs_point_at_a_renumbered_element_by_its_id() -> None:
    """A page whose ids are positions renumbers what a new element precedes: with element_refs each kept element is
    '[new] @[old]', so only the new elements are written out."""
    cfg = REFS.model_copy(update={"element_refs": True})
    ctx = ref_context(query(TW_STATE, "take red bell pepper from fridge"), cfg)
    encoded = encode_refs(TW_NEXT, ctx)
    assert encoded.splitlines() == [
        "@1", "[i1] carrying: a red bell pepper",
        "[i2] @[i1]", "@3", "[c2] command: drop red bell pepper", "[c3] @[c2]"]
    assert expand_refs(encoded, ctx) == TW_NEXT
    assert "@[" not in encode_refs(TW_NEXT, ref_context(query(TW_STATE, "x"), REFS))  # off: the rule before
    assert expand_refs("[c9] @[c7]", ctx) is None  # an id the state does not show: bad_ref
    assert expand_refs("[c9] @@[c2]", ctx) == "[c9] @[c2]"  # a literal @ is doubled, so never an element ref
    assert "[c4] @[c2]" in cfg.system_text()
    with pytest.raises(ValueError, match="set copy_refs too"):  # alone it would change nothing: refused
        ProtocolConfig(element_refs=True)


def test_element_refs_round_trip_any_text() -> None:
    rng = random.Random(1)
    pieces = ["[c1] command: drop cookbook", "[c7] command: open fridge", "[i2] carrying: a cookbook", "@[c1]",
              "[c4] @[c2]", "[x@y] command: open fridge", "[c5] command:", "@", "@@", "\n", "\n", "@2"]
    ctx = RefContext.of(TW_STATE + "\n[x@y] command: odd", None, (), element_refs=True)
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))).strip() or "x"
        assert expand_refs(encode_refs(text, ctx), ctx) == "\n".join(line.strip() for line in text.splitlines()), text
