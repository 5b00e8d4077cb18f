"""Reasoning annotation: the shop's rule-based traces, the teacher-LLM annotator, and `dreamgym annotate`."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.envs.base import RandomPolicy, TextEnv
from dreamgym.envs.shop.explain import INVALID_OUTCOME, explain_trajectory
from dreamgym.experience.annotate import (
    INSTRUCTIONS,
    REASONING_KEY,
    SYSTEM_PROMPT,
    LLMAnnotator,
    RuleAnnotator,
    TeacherConfig,
    annotate_file,
    clean_reasoning,
    extract_json_object,
    parse_annotation,
)
from dreamgym.experience.protocol import TAG_TEXTS, ProtocolConfig, step_target
from dreamgym.llm.base import Completion, LLMError, Prompt, SamplingParams
from dreamgym.types import Task, Trajectory, Transition, read_jsonl, write_jsonl

SHOP_KWARGS = {"num_products": 300}
SCORE = re.compile(r"score (?:0\.1\*)?(\d+)/(\d+)=(\d\.\d\d) -> done$")


class ChaosPolicy:
    """Random admissible actions, mixed with invalid ones (unknown clicks, malformed text, searches off the
    search page) and searches that find nothing: the cases scripted policies never produce."""

    name = "chaos"

    def __init__(self, seed: int = 0, p_invalid: float = 0.35) -> None:
        self.rng, self.p_invalid, self.random = random.Random(seed), p_invalid, RandomPolicy(seed)

    def reset(self, env: TextEnv, task: Task | None) -> None:
        pass

    def act(self, obs: str, info: dict[str, Any]) -> str:
        if self.rng.random() < self.p_invalid:
            return self.rng.choice(["click[no such thing]", "jump around", "search[zzqx vvkw]", "click[]"])
        return self.random.act(obs, info)


def episodes(policy: Any, n: int, seed: int) -> list[Trajectory]:
    env = make("shop", **SHOP_KWARGS)
    return list(iter_episodes(env, policy, n, split="train", seed=seed))


@pytest.fixture(scope="module")
def shop_trajs() -> list[Trajectory]:
    env = make("shop", **SHOP_KWARGS)
    oracle, noisy = env.scripted_policy("oracle"), env.scripted_policy("noisy", seed=1, noise=0.3)
    return [
        *episodes(oracle, 25, seed=0),
        *episodes(noisy, 40, seed=100),
        *episodes(env.scripted_policy("random", seed=2), 20, seed=200),
        *episodes(ChaosPolicy(seed=3), 15, seed=300),
    ]


@pytest.fixture(scope="module")
def annotated(shop_trajs: list[Trajectory]) -> tuple[list[Trajectory], RuleAnnotator]:
    annotator = RuleAnnotator()
    return annotator.annotate(shop_trajs), annotator


def steps(trajs: Sequence[Trajectory]) -> list[tuple[Trajectory, int, Transition]]:
    return [(t, i, x) for t in trajs for i, x in enumerate(t.transitions)]


# ------------------------------------------------------------------------------------ rule annotator


def test_every_transition_gets_a_trace_the_protocol_accepts(annotated: tuple[list[Trajectory], RuleAnnotator]) -> None:
    trajs, annotator = annotated
    assert len(trajs) == 100 and annotator.stats.trajectories == 100
    assert annotator.stats.counts == {}, annotator.stats.counts  # no replay or reward mismatch on real data
    cfg = ProtocolConfig()
    for traj, t, x in steps(trajs):
        trace = x.info[REASONING_KEY]
        assert trace.strip() and "\n" not in trace
        assert not any(tag in trace.lower() for tag in TAG_TEXTS)
        assert f"<think>{trace}</think>" in step_target(traj, t, trace, cfg)  # no ValueError, trace kept as is
    assert all(t.meta["annotator"] == "rule:shop" for t in trajs)
    assert all(set(t.meta["task_tutorial"]) == {"Overall Plan", "Success Mode", "Failure Mode"} for t in trajs)


def test_rule_explainer_options_the_explainer_does_not_take_are_a_one_line_error(shop_trajs: list[Trajectory]) -> None:
    with pytest.raises(ValueError, match=r"^env 'shop'\'s rule explainer takes no options \{'recipe': True\}"):
        RuleAnnotator(options={"recipe": True}).annotate(shop_trajs[:1])


def test_purchase_score_equals_the_recorded_reward(annotated: tuple[list[Trajectory], RuleAnnotator]) -> None:
    trajs, _ = annotated
    buys = [(traj, x) for traj, _, x in steps(trajs) if x.done and "Thank you for shopping" in x.next_state]
    assert len(buys) >= 60 and any(x.reward < 1 for _, x in buys) and any(x.reward == 1 for _, x in buys)
    for traj, x in buys:
        trace = x.info[REASONING_KEY]
        match = SCORE.search(trace)
        assert match is not None, trace
        assert match.group(3) == f"{x.reward:.2f}", trace
        # every value the checks compare is copied from the task or the item page being bought from
        checks = dict(part.split(" ", 1) for part in trace.split("; "))
        asin = checks["buy"]
        assert x.state.splitlines()[0].startswith(f"[1] text: {asin} — ")
        price, bound = re.fullmatch(r"(\S+)<=(\S+) [yn]", checks["price"]).groups()  # type: ignore[union-attr]
        assert f"Price: ${price}" in x.state and f"lower than {bound} dollars" in traj.task.instruction
        goal = traj.task.goal
        attrs = [re.fullmatch(r"attr (.+) (title|unseen) ([yn])", p) for p in trace.split("; ") if p.startswith("attr ")]
        assert [m.group(1) for m in attrs if m] == goal["attributes"]
        for m in attrs:
            assert m is not None
            if m.group(2) == "title":  # visible on the item page, so it can only be a yes
                assert m.group(3) == "y" and m.group(1) in x.state.splitlines()[0].lower()
        for part in trace.split("; "):
            if part.startswith("opt "):
                option = part[4:].rsplit(" sel ", 1)[0]
                assert part.endswith(" y") == (f"option: {option} (selected)" in x.state), part
        matched, total = int(match.group(1)), int(match.group(2))
        assert total == len(goal["attributes"]) + len(goal["options"]) + 1
        assert matched == sum(p.endswith(" y") for p in trace.split("; ")[2:-1])


def test_clicks_copy_the_clicked_line(annotated: tuple[list[Trajectory], RuleAnnotator]) -> None:
    trajs, _ = annotated
    kinds = {x.info[REASONING_KEY].split(" ", 1)[0].rstrip(":") for _, _, x in steps(trajs)}
    assert {"search", "open", "select", "next", "prev", "back", "description", "features", "buy", "invalid"} <= kinds
    for _, _, x in steps(trajs):
        trace = x.info[REASONING_KEY]
        if trace.startswith("open "):
            eid, asin, title, price = re.fullmatch(r'open \[(\d+)\] (\S+) "(.*)" \$(\S+) -> item page', trace).groups()  # type: ignore[union-attr]
            assert f"[{eid}] link: {asin} — {title} | ${price}" in x.state.splitlines()
            assert x.next_state.startswith(f"[1] text: {asin} — {title}\n[2] text: Price: ${price}")
        elif trace.startswith("select ") and "already selected" not in trace:
            eid, option = re.match(r"select \[(\d+)\] (\S+=[^ ]+(?: [^ ]+)*?) on ", trace).groups()  # type: ignore[union-attr]
            assert f"[{eid}] option: {option}" in x.state.splitlines()
            assert f"[{eid}] option: {option} (selected)" in x.next_state.splitlines()
        elif trace.startswith(("search ", "next ")) and "no results" not in trace:
            page, first, last, total = re.search(r"results page (\d+), (\d+)-(\d+) of (\d+)$", trace).groups()  # type: ignore[union-attr]
            assert x.next_state.startswith(f"[1] text: Page {page} (results {first}-{last} of {total})")


def test_invalid_actions_are_explained_as_such(annotated: tuple[list[Trajectory], RuleAnnotator]) -> None:
    trajs, _ = annotated
    invalid = [x for _, _, x in steps(trajs) if x.info["invalid_action"]]
    assert len(invalid) >= 10
    for _, _, x in steps(trajs):
        trace = x.info[REASONING_KEY]
        assert trace.startswith("invalid: ") == x.info["invalid_action"], trace
        if x.info["invalid_action"]:
            assert trace.endswith(INVALID_OUTCOME) and x.next_state == x.state and x.reward == 0
    traces = {x.info[REASONING_KEY] for x in invalid}
    assert "invalid: click[no such thing] not on this page -> state unchanged, reward 0" in traces
    assert 'invalid: "jump around" is not search[...] or click[...] -> state unchanged, reward 0' in traces
    assert any(t.startswith("invalid: search only works on the search page") for t in traces)
    assert any(x.info[REASONING_KEY] == 'search "zzqx vvkw" -> no results' for _, _, x in steps(trajs))


def test_a_record_the_replay_cannot_reproduce_is_counted_not_explained(shop_trajs: list[Trajectory]) -> None:
    traj = next(t for t in shop_trajs if t.success and t.num_steps >= 3).model_copy(deep=True)
    traj.transitions[-1].reward = 0.5  # a tampered purchase reward
    e = explain_trajectory(traj)
    assert e.issues["reward_mismatch"] == 1 and e.issues["replay_mismatch"] == 1 and e.issues["text_only_steps"] == 1
    assert e.reasoning[-1].endswith("reward 0.50") and "score" not in e.reasoning[-1]
    other_catalog = traj.model_copy(deep=True)
    other_catalog.meta["env_kwargs"] = {"num_products": 300, "catalog_seed": 1}
    e = explain_trajectory(other_catalog)
    assert e.issues["replay_mismatch"] == 1 and e.issues["text_only_steps"] == traj.num_steps
    assert len(e.reasoning) == traj.num_steps and all(e.reasoning)


def test_clean_reasoning_removes_every_protocol_text() -> None:
    text, cut = clean_reasoning("a <state>\n b </THINK> < reward > <</think>> c<|im_end|>d </s>")
    assert not cut and text == "a state b THINK reward think c d"
    text, cut = clean_reasoning("one two three four five", max_chars=12)
    assert cut and text == "one two…" and len(text) <= 12


# ------------------------------------------------------------------------------------ teacher LLM


def good_answer(n: int, fence: bool = True) -> str:
    plans = ",\n".join(f'{{"step_id": {i}, "transition_plan": "step {i} <state> works"}}' for i in range(1, n + 1))
    body = (
        '{"task_tutorial": {"Overall Plan": "search, open, buy", "Success Mode": ["right item", "right price"], '
        f'"Failure Mode": "wrong item",}}, "state_transitions": [{plans},],}}'  # trailing commas, as models write
    )
    return f"Sure! Here it is:\n```json\n{body}\n```\nHope this helps." if fence else body


class CannedTeacher:
    """A test double for a teacher's *output* (the LLM protocol): answers from a script keyed by call number,
    good JSON unless the script says otherwise; raises like a backend for prompts with a poison marker."""

    tokenizer: object | None = None

    def __init__(self, script: dict[int, str] | None = None) -> None:
        self.script, self.calls, self.seeds = script or {}, 0, list[int | None]()

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        self.calls += 1
        self.seeds.append(params.seed)
        texts = [p[-1]["content"] if isinstance(p, list) else p for p in prompts]
        if any("POISON" in t for t in texts):
            raise ValueError("prompt too long")
        if any("TIMEOUT" in t for t in texts):
            raise LLMError("server timed out")
        out = []
        for text in texts:
            n = int(re.search(r"TRAJECTORY \((\d+) steps\)", text).group(1))  # type: ignore[union-attr]
            out.append(Completion(self.script.get(self.calls, good_answer(n)), [], finish_reason="stop"))
        return out

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
        raise NotImplementedError


def test_json_extraction_and_validation() -> None:
    assert extract_json_object(good_answer(2))["state_transitions"][1]["step_id"] == 2  # type: ignore[index]
    assert extract_json_object('no json {"a": 1} then {"state_transitions": []}') == {"state_transitions": []}
    assert extract_json_object("{{{ not json") is None
    annotation, reason = parse_annotation(good_answer(3), 3)
    assert reason is None and annotation is not None
    assert annotation.task_tutorial.as_dict()["Success Mode"] == "right item; right price"
    assert parse_annotation(good_answer(3), 4) == (None, "bad_steps")
    assert parse_annotation('{"task_tutorial": {}, "state_transitions": []}', 0) == (None, "bad_schema")
    assert parse_annotation("I cannot help with that.", 1) == (None, "no_json")


def test_llm_annotator_parses_retries_and_falls_back(shop_trajs: list[Trajectory]) -> None:
    trajs = shop_trajs[20:26]
    # call 1 (all six): garbage for all; call 2 (the retry): good. Seeds differ between the attempts.
    teacher = CannedTeacher({1: "```json\n{ oops"})
    out = LLMAnnotator(teacher, TeacherConfig(retries=2, batch_size=8)).annotate(trajs)
    assert [t.traj_id for t in out] == [t.traj_id for t in trajs] and teacher.calls == 2
    assert teacher.seeds[0] != teacher.seeds[1]
    for src, t in zip(trajs, out, strict=True):
        assert t.meta["annotator"] == "llm" and t.meta["task_tutorial"]["Overall Plan"] == "search, open, buy"
        assert [x.info[REASONING_KEY] for x in t.transitions] == [f"step {i} state works" for i in range(1, src.num_steps + 1)]
        assert [x.next_state for x in t.transitions] == [x.next_state for x in src.transitions]  # data untouched

    teacher = CannedTeacher({i: "not json at all" for i in range(1, 10)})
    annotator = LLMAnnotator(teacher, TeacherConfig(retries=2, batch_size=4))
    out = annotator.annotate(trajs)
    assert teacher.calls == 6  # 2 batches x 3 attempts
    assert annotator.stats.counts["fallback:no_json"] == 6 and annotator.stats.fallbacks == 6
    expected = RuleAnnotator().annotate(trajs)
    for t, rule in zip(out, expected, strict=True):
        assert t.meta["annotator"] == "rule:shop" and t.meta["annotation_fallback"]["reason"] == "no_json"
        assert [x.info[REASONING_KEY] for x in t.transitions] == [x.info[REASONING_KEY] for x in rule.transitions]


def test_llm_annotator_isolates_backend_failures_and_keeps_every_trajectory(shop_trajs: list[Trajectory]) -> None:
    poison = shop_trajs[0].model_copy(update={"task": shop_trajs[0].task.model_copy(update={"instruction": "POISON"})})
    timeout = shop_trajs[1].model_copy(update={"task": shop_trajs[1].task.model_copy(update={"instruction": "TIMEOUT"})})
    foreign = Trajectory(
        task=Task(task_id="x", instruction="go north", env="alfworld"),  # an env without a rule explainer
        transitions=[Transition(state="room", action="go north", next_state="hall", reward=0.0, done=False)],
        meta={"env": "alfworld"},
    )
    trajs = [poison, shop_trajs[2], timeout, foreign, Trajectory(task=shop_trajs[3].task)]
    teacher = CannedTeacher({i: "{}" for i in range(1, 100)})  # every answer misses the schema
    annotator = LLMAnnotator(teacher, TeacherConfig(retries=1, batch_size=8))
    out = annotator.annotate(trajs)
    assert [t.traj_id for t in out] == [t.traj_id for t in trajs]
    reasons = [t.meta.get("annotation_fallback", {}).get("reason") for t in out]
    assert reasons == ["prompt_rejected", "bad_schema", "backend_error", "bad_schema", None]
    assert out[0].meta["annotation_fallback"]["attempts"] == 1  # a rejected prompt is not retried
    assert out[2].meta["annotation_fallback"]["attempts"] == 2  # a timeout is
    assert out[3].meta["annotator"] == "none" and out[3].transitions[0].info[REASONING_KEY] == ""
    assert out[4].meta["annotator"] == "llm" and out[4].num_steps == 0


@pytest.fixture(scope="module")
def micro_teacher(shop_trajs: list[Trajectory], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A micro Llama whose tokenizer knows the shop's text and the teacher prompt (so short prompts fit)."""
    from dreamgym.llm.tiny import init_tiny_model

    tmp = tmp_path_factory.mktemp("teacher")
    corpus = tmp / "corpus.jsonl"
    write_jsonl(corpus, shop_trajs[:30])
    (tmp / "prompt.txt").write_text((SYSTEM_PROMPT + "\n" + INSTRUCTIONS + "\n") * 10)
    init_tiny_model("micro", [corpus, tmp / "prompt.txt"], tmp / "micro", vocab_size=1024)
    return tmp / "micro"


def test_llm_annotator_on_a_real_hf_backend_falls_back_on_garbage(
    shop_trajs: list[Trajectory], micro_teacher: Path
) -> None:
    import torch

    from dreamgym.llm.hf import HFLLM

    torch.set_num_threads(1)
    teacher = HFLLM.from_pretrained(micro_teacher)
    short = [t for t in shop_trajs[:25] if t.num_steps <= 3][:3]
    long = max(shop_trajs, key=lambda t: t.num_steps)  # its prompt exceeds the micro model's context
    annotator = LLMAnnotator(teacher, TeacherConfig(max_new_tokens=24, retries=1, max_state_chars=150))
    out = annotator.annotate([*short, long])
    assert [t.traj_id for t in out] == [t.traj_id for t in [*short, long]]
    assert annotator.stats.fallbacks == 4 and all(t.meta["annotator"] == "rule:shop" for t in out)
    assert out[-1].meta["annotation_fallback"]["reason"] == "prompt_rejected"
    assert {t.meta["annotation_fallback"]["reason"] for t in out[:-1]} <= {"truncated", "no_json", "bad_schema"}
    assert all(x.info[REASONING_KEY] for t in out for x in t.transitions)


# ------------------------------------------------------------------------------------ files and CLI


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dreamgym", *args], capture_output=True, text=True, timeout=300)


def test_annotate_file_resumes_after_a_torn_write(shop_trajs: list[Trajectory], tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    write_jsonl(data, [*shop_trajs[:10], shop_trajs[3]])  # a duplicate id is annotated once
    out = tmp_path / "out.jsonl"
    first = annotate_file([data], RuleAnnotator(), out, batch_size=4)
    assert (first.written, first.skipped) == (10, 1)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:6]) + lines[6][:50])  # killed while writing the 7th
    again = annotate_file([data], RuleAnnotator(), out, batch_size=4)
    assert (again.written, again.skipped) == (4, 7)
    assert sorted(t.traj_id for t in read_jsonl(out)) == sorted(t.traj_id for t in shop_trajs[:10])
    with pytest.raises(ValueError, match="JSONL"):
        annotate_file([data], RuleAnnotator(), tmp_path / "out.parquet")


def test_cli_round_trip_resume_and_errors(shop_trajs: list[Trajectory], tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    write_jsonl(data, shop_trajs[:12])
    out = tmp_path / "annotated.jsonl"
    write_jsonl(out, RuleAnnotator().annotate(shop_trajs[:5]))  # an earlier, interrupted run
    r = run_cli("annotate", "--data", str(data), "--annotator", "rule", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert (summary["written"], summary["skipped"], summary["fallbacks"]) == (7, 5, 0)
    trajs = list(read_jsonl(out))
    assert [t.traj_id for t in trajs] == [t.traj_id for t in shop_trajs[:12]]
    assert all(x.info[REASONING_KEY] for t in trajs for x in t.transitions)

    r = run_cli("annotate", "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o.jsonl"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("annotate", "--data", str(data), "--annotator", "llm", "--out", str(tmp_path / "o.jsonl"))
    assert r.returncode == 2 and "--llm-config" in r.stderr
    (tmp_path / "bad.yaml").write_text("backend: nope\nmodel: x\n")
    r = run_cli("annotate", "--data", str(data), "--annotator", "llm", "--llm-config", str(tmp_path / "bad.yaml"),
                "--out", str(tmp_path / "o.jsonl"))
    assert r.returncode == 2 and "backend" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_with_a_teacher_backend(shop_trajs: list[Trajectory], micro_teacher: Path, tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    write_jsonl(data, [t for t in shop_trajs if t.num_steps <= 3][:2])
    out = tmp_path / "out.jsonl"
    r = run_cli("annotate", "--data", str(data), "--out", str(out), "--annotator", "llm", "--backend", "hf",
                "--model", str(micro_teacher), "--max-new-tokens", "16", "--retries", "0", "--max-state-chars", "150",
                "--threads", "1", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["written"] == 2 and summary["fallbacks"] == 2  # a micro model writes no usable JSON
    assert all(t.meta["annotation_fallback"]["from"] == f"llm:{micro_teacher}" for t in read_jsonl(out))
