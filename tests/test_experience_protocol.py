"""The experience model's text protocol: prompts, targets, and a parser that never raises."""

from __future__ import annotations

import math
import random
import re

import pytest

from dreamgym.experience.protocol import (
    FAILURE_REASONS,
    STOP_TEXTS,
    ExperienceQuery,
    Neighbour,
    ParseResult,
    ParseStats,
    ProtocolConfig,
    action_target,
    build_messages,
    build_prompt_text,
    failure_prediction,
    format_target,
    parse_or_fallback,
    parse_output,
    step_target,
    target_spans,
    truncate_lines,
)
from dreamgym.types import Task, Trajectory, Transition

WITH_REASONING = ProtocolConfig()
WITHOUT_REASONING = ProtocolConfig(reasoning=False)
WORDS = ["Red", "Cotton", "T-Shirt", "m", "$24.99", "|", "—", "über", "日本", "<", ">", "x=1", "&", "Buy Now"]  # fmt: skip
TYPES = ["text", "link", "button", "option", "searchbox"]


def random_state(rng: random.Random) -> str:
    return "\n".join(
        f"[{i}] {rng.choice(TYPES)}: {' '.join(rng.choices(WORDS, k=rng.randint(1, 6)))}"
        for i in range(1, rng.randint(1, 8) + 1)
    )


def random_case(rng: random.Random) -> tuple[str, float, bool, bool, str]:
    done = rng.random() < 0.4
    success = done and rng.random() < 0.5
    reward = rng.choice([0.0, 1.0, round(rng.random(), 2), rng.random()])
    reasoning = " ".join(rng.choices([*WORDS, "buy", "check price", "3/4=0.75", "\n"], k=rng.randint(0, 12)))
    return random_state(rng), reward, done, success, reasoning


def is_valid(result: ParseResult) -> bool:
    """A result is a well-formed prediction, or a failure with a documented reason; never both, never neither."""
    if result.prediction is None:
        return result.reason in FAILURE_REASONS
    p = result.prediction
    return (
        result.reason is None
        and p.failure is None
        and bool(p.next_state.strip())
        and math.isfinite(p.reward)
        and 0.0 <= p.reward <= 1.0
        and (p.done or not p.success)
    )


# ---------------------------------------------------------------------------------------- targets


@pytest.mark.parametrize("cfg", [WITH_REASONING, WITHOUT_REASONING], ids=["reasoning", "no-reasoning"])
def test_round_trip(cfg: ProtocolConfig) -> None:
    rng = random.Random(0)
    for _ in range(500):
        state, reward, done, success, reasoning = random_case(rng)
        text = format_target(state, reward, done, success, reasoning, cfg)
        result = parse_output(text, cfg)
        assert result.prediction is not None, (result.reason, text)
        p = result.prediction
        assert (p.next_state, p.done, p.success) == (state, done, success)
        assert p.reward == pytest.approx(round(reward, 2), abs=1e-9)
        assert p.reasoning == (reasoning.strip() if cfg.reasoning else None)
        assert ("<think>" in text) == cfg.reasoning


def test_target_layout_and_spans() -> None:
    args = ("[1] text: Thank you", 0.75, True, False, "price ok; 3/4 = 0.75")
    text = format_target(*args, WITH_REASONING)
    assert text == (
        "<think>price ok; 3/4 = 0.75</think>\n<state>\n[1] text: Thank you\n</state>\n"
        "<reward>0.75</reward> <done>1</done> <success>0</success>"
    )
    spans = target_spans(*args, WITH_REASONING)
    assert list(spans) == ["reasoning", "state", "reward", "done", "success"]
    assert spans["reasoning"][0] == 0 and spans["success"][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans.values(), list(spans.values())[1:], strict=False))
    assert text[slice(*spans["reward"])] == "<reward>0.75</reward>"
    assert "reasoning" not in target_spans(*args, WITHOUT_REASONING)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"reward": 1.5}, "reward"),
        ({"reward": float("nan")}, "reward"),
        ({"next_state": "  "}, "empty"),
        ({"next_state": "[1] text: a </state>"}, "protocol text"),
        ({"reasoning": "see <STATE>"}, "protocol text"),
        ({"next_state": "[1] text: a</s>b"}, "</s>"),
        ({"done": False, "success": True}, "success"),
        ({"reasoning": None}, "reasoning"),
    ],
)
def test_format_target_rejects_what_could_not_parse(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "next_state": "[1] text: a",
        "reward": 0.5,
        "done": True,
        "success": True,
        "reasoning": "r",
        "cfg": WITH_REASONING,
    }
    with pytest.raises(ValueError, match=match):
        format_target(**{**args, **kwargs})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------- parser


VALID = format_target(
    "[1] link: B07ABC — Red | $24.99\n[2] button: Next >", 0.5, False, False, "go", WITH_REASONING
)


@pytest.mark.parametrize(
    ("text", "cfg", "expected"),
    [
        ("  \n", WITH_REASONING, "empty"),
        ("<|im_end|>" + VALID, WITH_REASONING, "empty"),
        (VALID.replace("<think>go</think>\n", ""), WITH_REASONING, "missing_think"),
        ("<think>go</think> the next page is [1] text: a", WITH_REASONING, "missing_state"),
        (VALID.replace("0.50", "nan"), WITH_REASONING, "bad_reward"),
        (VALID.replace("0.50", "inf"), WITH_REASONING, "bad_reward"),
        (VALID.replace("0.50", "1e999"), WITH_REASONING, "bad_reward"),
        (VALID.replace("0.50", "0.5.1"), WITH_REASONING, "bad_reward"),
        (VALID.replace("0.50", "1_0"), WITH_REASONING, "bad_reward"),
        (VALID.replace("0.50", "٠.٥"), WITH_REASONING, "bad_reward"),  # non-ASCII digits
        (VALID.replace("0.50", "-0.25"), WITH_REASONING, "reward_out_of_range"),
        (VALID.replace("0.50", "1e3"), WITH_REASONING, "reward_out_of_range"),
        (VALID.replace("<done>0</done>", "<done>yes</done>"), WITH_REASONING, "bad_done"),
        (VALID.replace("<success>0</success>", "<success>2</success>"), WITH_REASONING, "bad_success"),
        (VALID.replace("<success>0</success>", "<success>1</success>"), WITH_REASONING, "success_not_done"),
        (VALID.replace(" <done>0</done>", ""), WITH_REASONING, "missing_done"),
        (VALID.replace(" <success>0</success>", ""), WITH_REASONING, "missing_success"),
        (
            VALID.replace("[1] link: B07ABC — Red | $24.99\n[2] button: Next >", " \n "),
            WITH_REASONING,
            "empty_state",
        ),
        (VALID.replace("</state>", "</state><state>x</state>"), WITH_REASONING, "duplicate_state"),
        (VALID.replace("<state>", "<state><state>"), WITH_REASONING, "unclosed_state"),
        (VALID.replace("</reward>", "<done>"), WITH_REASONING, "unclosed_reward"),
        (VALID.replace("</state>", "</state><think>again</think>"), WITH_REASONING, "duplicate_think"),
        (VALID[:-3], WITH_REASONING, "truncated"),
        (VALID[: VALID.index("<reward>") + 4], WITH_REASONING, "truncated"),
        (VALID[: VALID.index("<reward>")], WITH_REASONING, "missing_reward"),
    ],
)
def test_failure_reasons(text: str, cfg: ProtocolConfig, expected: str) -> None:
    result = parse_output(text, cfg)
    assert result.prediction is None and result.reason == expected


def test_length_limited_output_counts_as_truncated() -> None:
    cut = VALID[: VALID.index("<reward>")]
    assert parse_output(cut, WITH_REASONING).reason == "missing_reward"
    assert parse_output(cut, WITH_REASONING, length_limited=True).reason == "truncated"


def test_tolerated_variations() -> None:
    state = "[1] link: B07ABC — Red | $24.99\n[2] button: Next >"
    variants = [
        VALID.upper().replace(state.upper(), state).replace("GO", "go"),  # tag case
        VALID.replace("<state>", "< state >").replace("</reward>", "</ reward>"),  # spaces inside tags
        "Sure, here is the next step.\n" + VALID,  # preamble
        VALID + "<|im_end|><state>junk</state>",  # stop token, then junk
        VALID + "\n\nanything <reward>9</reward>",  # trailing junk
        VALID.replace("\n<state>\n", "\n\n  <state>\n\n").replace("<reward>0.50", "<reward> .5 "),
        VALID.replace("<done>0", "<done> False ").replace("<success>0", "<success>FALSE"),
        VALID.replace("<think>go</think>", "<think>the <state> will show </think>"),  # tags inside reasoning
    ]
    for text in variants:
        result = parse_output(text, WITH_REASONING)
        assert result.prediction is not None, (result.reason, text)
        assert result.prediction.next_state == state
        assert (result.prediction.reward, result.prediction.done) == (0.5, False)
    no_think = VALID.replace("<think>go</think>\n", "")
    assert parse_output(no_think, WITHOUT_REASONING).ok  # <think> optional without reasoning ...
    assert parse_output(VALID, WITHOUT_REASONING).prediction.reasoning == "go"  # type: ignore[union-attr]


def fuzz_corpus(n: int, seed: int = 0) -> list[str]:
    """Random bytes, every truncation of valid outputs, mutated tags, odd numbers and unicode."""
    rng = random.Random(seed)
    valid = [
        format_target(*random_case(rng), cfg) for cfg in (WITH_REASONING, WITHOUT_REASONING) for _ in range(4)
    ]
    corpus = [text[:i] for text in valid for i in range(len(text))]
    tags = [
        f"<{slash}{tag}>" for tag in ("think", "state", "reward", "done", "success") for slash in ("", "/")
    ]
    odd = "<STATE > < /Reward> < > </ nan -inf inf 1e308 1e309 -0.0 0.999999 1.0000001 -1 true TRUE yes 0x1 ½ ١ 𝟙"
    pieces = [
        *tags,
        *odd.split(),
        "\n",
        " ",
        "[1] link: x",
        "9" * 400,
        "\u200b",
        "\x00",
        "\ud800",
        *STOP_TEXTS,
    ]
    numbers = [*odd.split()[7:20], "9" * 400, "", " ", "0.5 0.5", "1e-400", "+.5", "0.", "٠.٥"]
    while len(corpus) < n:
        kind = rng.randrange(5)
        if kind == 0:  # random bytes
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
            corpus.append(raw.decode("utf-8", "replace"))
        elif kind == 1:  # random sequences of protocol pieces (nested, duplicated, out of order tags)
            corpus.append("".join(rng.choices(pieces, k=rng.randrange(1, 30))))
        elif kind == 2:  # an odd value in the reward, done or success slot
            value, tag = rng.choice(numbers), rng.choice(["reward", "done", "success"])
            corpus.append(re.sub(rf"<{tag}>[^<]*</{tag}>", f"<{tag}>{value}</{tag}>", rng.choice(valid)))
        else:  # a valid output with one piece inserted, or a span replaced by a piece
            text = rng.choice(valid)
            i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
            corpus.append(text[:i] + rng.choice(pieces) + text[(j if kind == 4 else i) :])
    return corpus[:n]


def test_fuzz_never_raises_and_every_output_is_counted() -> None:
    corpus = fuzz_corpus(10_000)
    assert len(corpus) == 10_000
    for cfg in (WITH_REASONING, WITHOUT_REASONING):
        stats = ParseStats()
        for text in corpus:
            result = parse_output(text, cfg)
            assert is_valid(result), (text, result)
            stats.add(result)
        assert stats.total == len(corpus)
        assert stats.failed == len(corpus) - stats.ok > 0 and stats.ok > 0
        assert set(stats.failures) <= set(FAILURE_REASONS)


def test_every_proper_prefix_of_a_valid_output_fails() -> None:
    rng = random.Random(1)
    for cfg in (WITH_REASONING, WITHOUT_REASONING):
        for _ in range(5):
            text = format_target(*random_case(rng), cfg)
            assert parse_output(text, cfg).ok
            for i in range(len(text)):
                result = parse_output(text[:i], cfg, length_limited=True)
                assert result.reason == "truncated", (text[:i], result)
                reason = parse_output(text[:i], cfg).reason
                assert reason in ("empty", "truncated") or (reason or "").startswith("missing_"), (
                    text[:i],
                    reason,
                )


# ---------------------------------------------------------------------------------------- fallback


def test_failure_prediction_and_parse_or_fallback() -> None:
    state = "[1] button: Buy Now"
    p = failure_prediction(state, "bad_reward")
    assert (p.next_state, p.reward, p.done, p.success, p.failure) == (state, 0.0, False, False, "bad_reward")
    stats = ParseStats()
    outputs = [VALID, "garbage", VALID.replace("0.50", "7"), VALID]
    preds = [parse_or_fallback(text, state, WITH_REASONING, stats) for text in outputs]
    assert [x.failure for x in preds] == [None, "missing_think", "reward_out_of_range", None]
    assert preds[1].next_state == state and preds[0].reward == 0.5
    assert (stats.ok, stats.failed, stats.total, stats.invalid_rate) == (2, 2, 4, 0.5)
    merged = ParseStats()
    merged.merge(stats)
    merged.merge(stats)
    assert merged.as_dict() == {
        "ok": 4,
        "failed": 4,
        "invalid_rate": 0.5,
        "failures": {"missing_think": 2, "reward_out_of_range": 2},
    }


# ---------------------------------------------------------------------------------------- prompts


def make_query(steps: int = 5, neighbours: int = 3, state_lines: int = 4) -> ExperienceQuery:
    history = [(f"[1] text: page {i}\n[2] button: Next >", f"click[item {i}]") for i in range(1, steps + 1)]
    retrieved = [
        Neighbour(
            f"[1] text: n{j} before",
            f"click[n{j}]",
            f"[1] text: n{j} after\n[2] button: Buy Now",
            0.25 * j,
            j == 2,
        )
        for j in range(1, neighbours + 1)
    ]
    state = "\n".join(f"[{i}] link: B0{i:05d} — Product {i} | ${i}.99" for i in range(1, state_lines + 1))
    return ExperienceQuery("i need a red shirt under 30 dollars", history, retrieved, state, "click[B000001]")


def test_prompt_sections_window_and_k() -> None:
    query = make_query()
    text = build_prompt_text(query, ProtocolConfig(history_window=2, k=2))
    assert "#3" not in text and "#4 click[item 4]" in text and "#5 click[item 5]" in text
    assert "page 4" not in text  # previous states are off by default
    assert "(1)" in text and "(2)" in text and "(3)" not in text
    assert "→ click[n1]\n⇒\n[1] text: n1 after\n[2] button: Buy Now\n| r=0.25 d=0" in text
    assert "| r=0.50 d=1" in text
    assert text.endswith("STATE:\n" + query.state + "\nACTION: click[B000001]\n"
                         "TARGET: [1] link: B000001 — Product 1 | $1.99\n")  # the element the action names
    order = [text.index(h) for h in ("TASK:", "HISTORY:", "SIMILAR:", "STATE:", "ACTION:", "TARGET:")]
    assert order == sorted(order)

    compact = build_prompt_text(query, ProtocolConfig(neighbour_states=False))
    assert "(1)\n→ click[n1]\n⇒\n[1] text: n1 after" in compact and "n1 before" not in compact

    with_states = build_prompt_text(query, ProtocolConfig(history_window=1, history_states=True))
    assert "#5\n[1] text: page 5\n[2] button: Next >\n→ click[item 5]" in with_states

    ablated = build_prompt_text(query, ProtocolConfig(history_window=0, k=0))
    assert "HISTORY:" not in ablated and "SIMILAR:" not in ablated and "STATE:" in ablated
    assert "HISTORY:" not in build_prompt_text(make_query(steps=0), WITH_REASONING)


def test_task_last_moves_only_the_task_line_to_the_end() -> None:
    query = make_query()
    first = build_prompt_text(query, ProtocolConfig(k=2))
    last = build_prompt_text(query, ProtocolConfig(k=2, task_last=True))
    task = "TASK: i need a red shirt under 30 dollars"
    assert last.endswith("TARGET: [1] link: B000001 — Product 1 | $1.99\n" + task + "\n")
    assert sorted(last.splitlines()) == sorted(first.splitlines()) and last.count("TASK:") == 1
    assert last.replace(task + "\n", "") == first.replace(task + "\n", "")


def test_prompt_is_deterministic_and_messages_match_text() -> None:
    cfg = ProtocolConfig(k=3)
    query = make_query()
    assert build_prompt_text(query, cfg) == build_prompt_text(make_query(), cfg)
    messages = build_messages(query, cfg)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert build_prompt_text(query, cfg) == f"{messages[0]['content']}\n\n{messages[1]['content']}\n"
    assert "<think>" in messages[0]["content"]
    assert "<think>" not in build_messages(query, WITHOUT_REASONING)[0]["content"]
    bare = ProtocolConfig(k=3, system_prompt="")
    assert [m["role"] for m in build_messages(query, bare)] == ["user"]
    assert build_prompt_text(query, bare) == messages[1]["content"] + "\n"


def test_truncation_limits() -> None:
    query = make_query(state_lines=40, neighbours=2)
    query.retrieved[0] = Neighbour("[1] text: " + "x" * 500, "click[a]", query.state, 0.0, False)
    cfg = ProtocolConfig(max_state_chars=200, max_neighbour_chars=80, k=2)
    user = build_messages(query, cfg)[-1]["content"]
    state_block = user.split("STATE:\n")[1].split("\nACTION:")[0]
    assert len(state_block) <= 200 and state_block.endswith("\n…")
    assert all(line in query.state.splitlines() for line in state_block.splitlines()[:-1])  # whole lines kept
    neighbour = user.split("(1)\n")[1].split("\n(2)")[0]
    before, after = neighbour.split("\n→ click[a]\n⇒\n")
    assert len(before) == 80 and before.endswith("…")  # a single too-long line is cut inside
    assert len(after.split("\n| r=")[0]) <= 80
    assert truncate_lines("a\nb", None) == "a\nb" and truncate_lines("abc\ndef", 7) == "abc\ndef"
    assert truncate_lines("abc\ndef\nghi", 9) == "abc\ndef\n…"
    assert truncate_lines("abc\ndef\nghi", 8) == "abc\n…"
    with pytest.raises(ValueError):
        ProtocolConfig(max_state_chars=0)
    with pytest.raises(ValueError):
        ProtocolConfig(k=-1)


def test_query_at_step() -> None:
    trs = [
        Transition(
            state=f"[1] text: s{i}", action=f"a{i}", next_state=f"[1] text: s{i + 1}", reward=0.0, done=i == 2
        )
        for i in range(3)
    ]
    traj = Trajectory(task=Task(task_id="t", instruction="buy"), transitions=trs)
    q = ExperienceQuery.at_step(traj, 2, [Neighbour.from_transition(trs[0])])
    assert q.history == [("[1] text: s0", "a0"), ("[1] text: s1", "a1")]
    assert (q.state, q.action, q.instruction, q.retrieved[0].next_state) == (
        "[1] text: s2",
        "a2",
        "buy",
        "[1] text: s1",
    )
    with pytest.raises(IndexError):
        ExperienceQuery.at_step(traj, 3)
    assert step_target(traj, 0, None, WITHOUT_REASONING).endswith("<done>0</done> <success>0</success>")
    assert step_target(traj, 2, None, WITHOUT_REASONING).endswith("<done>1</done> <success>0</success>")
    cut = trs[2].model_copy(update={"info": {"truncated": True}})
    assert step_target(
        traj.model_copy(update={"transitions": [*trs[:2], cut]}), 2, None, WITHOUT_REASONING
    ).endswith("<done>0</done> <success>0</success>")
    won = traj.model_copy(update={"success": True})
    assert step_target(won, 2, "ok", WITH_REASONING).endswith("<done>1</done> <success>1</success>")


def test_action_target_finds_the_named_element_case_blind() -> None:
    page = ("[1] text: B0DGQT29 — Nolove Velvet Sofa\n[2] text: Price: $289.47\n[3] option: color=brown (selected)\n"
            "[4] option: size=3 seater\n[5] button: Buy Now\n[6] link: B0AAAA11 — Other Sofa | $1.00")
    assert action_target(page, "click[b0aaaa11]") == "[6] link: B0AAAA11 — Other Sofa | $1.00"
    assert action_target(page, "click[BROWN]") == "[3] option: color=brown (selected)"
    assert action_target(page, "click[3  seater]") == "[4] option: size=3 seater"
    assert action_target(page, "click[buy now]") == "[5] button: Buy Now"
    # nothing named, no brackets, a search query: no TARGET line, and the prompt says nothing false
    assert action_target(page, "click[red]") is None
    assert action_target(page, "take key") is None
    assert action_target(page, "search[velvet sofa]") is None
    query = ExperienceQuery("buy a sofa", [], [], page, "click[red]")
    assert "TARGET:" not in build_prompt_text(query, ProtocolConfig(k=0))
    grounded = ExperienceQuery("buy a sofa", [], [], page, "click[brown]")
    assert "TARGET:" not in build_prompt_text(grounded, ProtocolConfig(k=0, ground_action=False))


def test_models_saved_before_the_target_line_load_without_it() -> None:
    from dreamgym.experience.model import ExperienceConfig

    old = ExperienceConfig(protocol={"k": 0, "history_window": 2})  # an experience.json without ground_action
    assert old.protocol_config().ground_action is False
    assert ExperienceConfig.from_protocol(ProtocolConfig()).protocol_config().ground_action is True


def test_protocol_teacher_and_index_configs_are_strict_pydantic_models() -> None:
    import pydantic

    from dreamgym.experience.annotate import TeacherConfig
    from dreamgym.experience.model import ExperienceConfig
    from dreamgym.replay import IndexConfig

    for cls, bad in ((ProtocolConfig, {"k": -1}), (TeacherConfig, {"retries": -1}), (IndexConfig, {"threads": "x"})):
        assert issubclass(cls, pydantic.BaseModel)
        with pytest.raises(pydantic.ValidationError, match="extra"):
            cls(no_such_field=1)
        with pytest.raises(ValueError):
            cls(**bad)
        assert cls.model_validate(cls().model_dump()) == cls()
    with pytest.raises(ValueError):
        TeacherConfig(fallback="nope")  # type: ignore[arg-type]
    assert ProtocolConfig().model_copy(update={"k": 0}).k == 0
    with pytest.raises(pydantic.ValidationError):
        IndexConfig().threads = 2  # type: ignore[misc]  # frozen, as the dataclass was
    # An experience.json written when ProtocolConfig was a dataclass (dataclasses.asdict) still loads.
    saved = ('{"protocol": {"history_window": 2, "history_states": false, "k": 1, "neighbour_states": false, '
             '"reasoning": true, "max_state_chars": 1200, "max_neighbour_chars": 600, "system_prompt": ""}, '
             '"chat": true, "max_new_tokens": 200}')
    old = ExperienceConfig.model_validate_json(saved).protocol_config()
    assert (old.history_window, old.k, old.system_prompt, old.ground_action, old.copy_refs,
            old.exact_neighbours, old.checked_verdicts, old.task_last, old.same_action_neighbours, old.layout_refs,
            old.computed_premises, old.task_neighbours, old.neighbour_changes) == (
        2, 1, "", False, False, False, False, False, False, False, False, False, False)  # trained before
    assert ExperienceConfig.from_protocol(old).protocol == old.model_dump()
    assert set(old.model_dump()) == {"history_window", "history_states", "k", "neighbour_states", "reasoning",
                                     "max_state_chars", "max_neighbour_chars", "system_prompt", "ground_action",
                                     "copy_refs", "exact_neighbours", "checked_verdicts", "task_last",
                                     "same_action_neighbours", "layout_refs", "element_refs", "computed_premises",
                                     "cut_history_first", "task_neighbours", "neighbour_changes",
                                     "cut_neighbour_page"}
