"""Reasoning annotation of real transitions: the traces R*_t the experience model learns to write.

An annotated trajectory is the same :class:`~dreamgym.types.Trajectory` with ``transitions[t].info["reasoning"]``
(the transition plan of step t, what goes inside ``<think>…</think>`` before the next state, see
:func:`dreamgym.experience.protocol.format_target`) and, in ``meta``, ``"annotator"`` (who wrote the traces) and
``"task_tutorial"`` (``Overall Plan`` / ``Success Mode`` / ``Failure Mode``) when the annotator gives one.

Two annotators, one interface (:class:`Annotator`: ``annotate(trajs) -> trajs``, batched):

* :class:`RuleAnnotator` explains each transition from the environment's ground truth with the env's own
  explainer (the shop's is :mod:`dreamgym.envs.shop.explain`): the CPU default, no teacher needed.
* :class:`LLMAnnotator` asks a teacher LLM, through any backend, with the paper's App. C.1 prompt (the task,
  the success flag and the whole trajectory; a JSON answer). A malformed answer is retried with another seed,
  then replaced by the rule annotator's traces (or empty ones where the env has no explainer). Every fallback
  is counted in :class:`AnnotationStats` and logged, and no trajectory is ever dropped.

Every trace passes :func:`clean_reasoning`, so no protocol tag text can reach a training target.
:func:`annotate_file` runs an annotator over trajectory files into a resumable JSONL output.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dreamgym.envs.base import find_spec, registered
from dreamgym.envs.explain_diff import explain_state_diff
from dreamgym.experience.protocol import STOP_TEXTS, TAGS, truncate_lines
from dreamgym.llm.base import LLM, ChatMessages, Completion, LLMError, SamplingParams
from dreamgym.types import DataError, Explanation, JsonlWriter, Trajectory, read_jsonl, read_trajectories

log = logging.getLogger(__name__)

REASONING_KEY = "reasoning"  # transitions[t].info[REASONING_KEY]: the trace of step t
TUTORIAL_KEYS = ("Overall Plan", "Success Mode", "Failure Mode")


# ---------------------------------------------------------------------------------------- common part


Explainer = Callable[..., Explanation]  # (trajectory, **options)


@dataclass
class AnnotationStats:
    """Counts of an annotation run; ``counts`` holds fallbacks (``fallback:<reason>``) and explainer issues."""

    trajectories: int = 0
    steps: int = 0
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def fallbacks(self) -> int:
        return sum(n for key, n in self.counts.items() if key.startswith("fallback:"))

    def as_dict(self) -> dict[str, Any]:
        return {
            "trajectories": self.trajectories,
            "steps": self.steps,
            "fallbacks": self.fallbacks,
            "counts": dict(sorted(self.counts.items())),
        }


class Annotator(Protocol):
    """Annotates a batch of trajectories, returning annotated copies in the same order (never fewer)."""

    name: str
    stats: AnnotationStats

    def annotate(self, trajs: Sequence[Trajectory]) -> list[Trajectory]: ...


def env_of(traj: Trajectory) -> str:
    """The env a trajectory was recorded in (``meta["env"]``, else the task's env)."""
    return str(traj.meta.get("env") or traj.task.env)


def rule_explainer(env: str) -> Explainer | None:
    """The rule-based explainer of ``env`` (its :attr:`EnvSpec.explainer`), or None when it has none."""
    env_spec = find_spec(env)
    explainer: Explainer | None = env_spec.load("explainer") if env_spec is not None else None
    return explainer


# A protocol tag in any spelling the experience-output parser accepts (``< State >``, ``</THINK>``).
_PROTOCOL_TAG = re.compile(r"<\s*/?\s*(" + "|".join(TAGS) + r")\s*>", re.IGNORECASE)


def clean_reasoning(text: str, max_chars: int | None = None) -> tuple[str, bool]:
    """``(trace, was_cut)``: protocol tags reduced to their bare name (``<state>`` -> ``state``), stop-token
    texts replaced by a space, whitespace collapsed to single spaces, then cut at a word to ``max_chars``
    (ending with ``…``)."""
    text = str(text)
    while True:  # removing one text can join its neighbours into another ("<</think>>" -> "<think>")
        cleaned = _PROTOCOL_TAG.sub(lambda m: m.group(1), text)
        for stop in STOP_TEXTS:
            cleaned = cleaned.replace(stop, " ")
        if cleaned == text:
            break
        text = cleaned
    text = " ".join(text.split())
    if max_chars is None or len(text) <= max_chars:
        return text, False
    cut = text[: max_chars - 1].rsplit(" ", 1)[0] if " " in text[: max_chars - 1] else text[: max_chars - 1]
    return cut + "…", True


def apply_annotation(
    traj: Trajectory,
    reasoning: Sequence[str],
    annotator: str,
    task_tutorial: dict[str, str] | None = None,
    max_chars: int | None = None,
    stats: AnnotationStats | None = None,
) -> Trajectory:
    """An annotated copy of ``traj``: one cleaned trace per transition, the tutorial and the annotator name.
    Annotations already on ``traj`` are replaced."""
    if len(reasoning) != len(traj.transitions):
        raise ValueError(f"trajectory {traj.traj_id}: {len(reasoning)} traces for {len(traj.transitions)} steps")
    out = traj.model_copy(deep=True)
    for x, trace in zip(out.transitions, reasoning, strict=True):
        x.info[REASONING_KEY], cut = clean_reasoning(trace, max_chars)
        if cut and stats is not None:
            stats.counts["reasoning_cut"] += 1
    for key in ("task_tutorial", "annotation_fallback"):
        out.meta.pop(key, None)
    if task_tutorial:
        out.meta["task_tutorial"] = dict(task_tutorial)
    out.meta["annotator"] = annotator
    if stats is not None:
        stats.trajectories += 1
        stats.steps += len(out.transitions)
    return out


class RuleAnnotator:
    """Annotates each trajectory with its env's rule-based explainer (:attr:`EnvSpec.explainer`); ``options`` go to
    the explainer as keywords (e.g. TextWorld's ``recipe``; one it does not take is a ValueError)."""

    name = "rule"

    def __init__(self, max_reasoning_chars: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.max_reasoning_chars = max_reasoning_chars
        self.options = dict(options or {})
        self.stats = AnnotationStats()

    @staticmethod
    def supports(traj: Trajectory) -> bool:
        return rule_explainer(env_of(traj)) is not None

    def explain(self, traj: Trajectory) -> Explanation:
        explainer = rule_explainer(env_of(traj))
        if explainer is None:
            known = ", ".join(name for name in registered() if rule_explainer(name) is not None)
            raise DataError(f"trajectory {traj.traj_id}: env {env_of(traj)!r} has no rule-based explainer (envs "
                            f"with one: {known}); annotate with 'diff' (any env) or 'llm'")
        try:
            explanation = explainer(traj, **self.options)
        except TypeError as e:
            if not self.options:
                raise
            raise ValueError(f"env {env_of(traj)!r}'s rule explainer takes no options {self.options} ({e})") from None
        self.stats.counts.update(explanation.issues)
        return explanation

    def annotate(self, trajs: Sequence[Trajectory]) -> list[Trajectory]:
        out = []
        for traj in trajs:
            e = self.explain(traj)
            name = f"{self.name}:{env_of(traj)}"
            out.append(apply_annotation(traj, e.reasoning, name, e.task_tutorial, self.max_reasoning_chars, self.stats))
        return out


class DiffAnnotator(RuleAnnotator):
    """Any env's traces without env code: what each action changed in the ``[id] type: text`` elements
    (:func:`dreamgym.envs.explain_diff.explain_state_diff`). The fallback for an env with no explainer."""

    name = "diff"

    @staticmethod
    def supports(traj: Trajectory) -> bool:
        return True

    def explain(self, traj: Trajectory) -> Explanation:
        explanation = explain_state_diff(traj)
        self.stats.counts.update(explanation.issues)
        return explanation


# ------------------------------------------------------------------------------------ teacher LLM

SYSTEM_PROMPT = (
    "You annotate trajectories of an agent acting in an interactive environment. Your annotations teach a "
    "model to simulate the environment: given a state and an action, to predict the next state and reward. "
    "Answer with one JSON object and nothing else."
)

# The paper's App. C.1 request: a task tutorial and one transition plan per step, as JSON.
INSTRUCTIONS = """\
Write a tutorial for this task and explain every state transition.
- "task_tutorial": "Overall Plan" (the steps that solve the task), "Success Mode" (what a successful episode \
does), "Failure Mode" (the mistakes that lower the reward or end the episode without success).
- "state_transitions": for every step_id from 1 to {n}, a "transition_plan": judge whether the action can be \
carried out in its state, then say how the state changes and why the reward is what it is. Copy the exact \
ids, option values and prices from the states.
Answer with this JSON object only:
{{"task_tutorial": {{"Overall Plan": "...", "Success Mode": "...", "Failure Mode": "..."}}, \
"state_transitions": [{{"step_id": 1, "transition_plan": "..."}}]}}"""

RETRY_SEED_STRIDE = 100_003  # attempt a samples prompt i with seed + a * stride + i: never a seed reused


class TeacherConfig(BaseModel):
    """How the teacher is asked. ``retries``: extra attempts (new seed each) after a malformed answer."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(default=2048, ge=1)
    temperature: float = 0.7  # > 0 so that a retry with another seed gives another answer
    top_p: float = 0.95
    retries: int = Field(default=2, ge=0)
    seed: int = 0
    batch_size: int = Field(default=16, ge=1)  # trajectories per generate() call
    max_state_chars: int | None = 1500  # each state in the prompt is cut at whole lines to this length
    max_reasoning_chars: int | None = 600  # each transition plan is cut to this length
    fallback: Literal["rule", "empty"] = "rule"  # "rule": the env's explainer where it has one


class TaskTutorial(BaseModel):
    """The paper's task tutorial; reads its keys as written in the prompt or in snake case."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", str_strip_whitespace=True)

    overall_plan: str = Field(alias="Overall Plan", min_length=1)
    success_mode: str = Field(alias="Success Mode", min_length=1)
    failure_mode: str = Field(alias="Failure Mode", min_length=1)

    @field_validator("overall_plan", "success_mode", "failure_mode", mode="before")
    @classmethod
    def _join_lists(cls, value: Any) -> Any:
        """Teachers often answer a mode as a list of points: keep them, joined."""
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return "; ".join(value)
        return value

    def as_dict(self) -> dict[str, str]:
        return dict(zip(TUTORIAL_KEYS, (self.overall_plan, self.success_mode, self.failure_mode), strict=True))


class StateTransition(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    step_id: int
    transition_plan: str = Field(min_length=1)


class TeacherAnnotation(BaseModel):
    """The JSON the teacher must answer (paper App. C.1)."""

    model_config = ConfigDict(extra="ignore")

    task_tutorial: TaskTutorial
    state_transitions: list[StateTransition]


def _format_step(i: int, x: Any, max_state_chars: int | None) -> list[str]:
    outcome = f"RESULT: reward {x.reward:.2f}, done {int(x.done)}"
    if x.info.get("invalid_action"):
        outcome += " (invalid action: the state did not change)"
    elif x.info.get("truncated"):
        outcome += " (step limit reached)"
    return [f"STEP {i}", "STATE:", truncate_lines(x.state, max_state_chars), f"ACTION: {x.action.strip()}", outcome]


def annotation_messages(traj: Trajectory, max_state_chars: int | None = 1500) -> ChatMessages:
    """The teacher's chat prompt for one trajectory: task, outcome, every step, the final state, the request."""
    n = len(traj.transitions)
    final = traj.transitions[-1].reward if n else 0.0
    lines = [
        f"ENVIRONMENT: {env_of(traj)}",
        f"TASK: {traj.task.instruction.strip()}",
        f"OUTCOME: {'success' if traj.success else 'failure'}, final reward {final:.2f}",
        f"TRAJECTORY ({n} steps):",
    ]
    for i, x in enumerate(traj.transitions, start=1):
        lines += _format_step(i, x, max_state_chars)
    if n:
        lines += ["FINAL STATE:", truncate_lines(traj.transitions[-1].next_state, max_state_chars)]
    lines += ["", INSTRUCTIONS.format(n=n)]
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]


_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
MAX_JSON_CANDIDATES = 32  # "{" positions tried; bounds the work on long garbage


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The teacher's JSON object inside free text: code fences, prose around it and trailing commas are
    tolerated. Prefers the first object with a ``state_transitions`` key, else the first object; None if none."""
    decoder = json.JSONDecoder()
    first: dict[str, Any] | None = None
    for tries, match in enumerate(re.finditer(r"\{", text)):
        if tries >= MAX_JSON_CANDIDATES:
            break
        rest = text[match.start() :]
        for candidate in (rest, _TRAILING_COMMA.sub(r"\1", rest)):
            try:
                obj, _ = decoder.raw_decode(candidate)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                if "state_transitions" in obj:
                    return obj
                first = first if first is not None else obj
            break
    return first


def parse_annotation(text: str, num_steps: int) -> tuple[TeacherAnnotation | None, str | None]:
    """``(annotation, None)`` or ``(None, reason)``; reasons: ``no_json``, ``bad_schema``, ``bad_steps``.
    Never raises. The step ids must be exactly 1..num_steps (in any order)."""
    obj = extract_json_object(text)
    if obj is None:
        return None, "no_json"
    try:
        annotation = TeacherAnnotation.model_validate(obj)
    except ValidationError:
        return None, "bad_schema"
    if sorted(s.step_id for s in annotation.state_transitions) != list(range(1, num_steps + 1)):
        return None, "bad_steps"
    return annotation, None


class LLMAnnotator:
    """The teacher-LLM annotator (paper App. C.1) over any :class:`~dreamgym.llm.base.LLM` backend.

    Trajectories are asked in batches of ``cfg.batch_size``; the ones whose answer does not parse are asked
    again (new seed) up to ``cfg.retries`` times, then get the fallback traces.
    """

    def __init__(self, llm: LLM, cfg: TeacherConfig | None = None, name: str = "llm") -> None:
        self.llm = llm
        self.cfg = cfg or TeacherConfig()
        self.name = name
        self.stats = AnnotationStats()
        self.rules = RuleAnnotator(self.cfg.max_reasoning_chars)
        self.rules.stats = self.stats  # explainer issues of fallbacks land in the same counts

    def annotate(self, trajs: Sequence[Trajectory]) -> list[Trajectory]:
        out: list[Trajectory] = []
        for start in range(0, len(trajs), self.cfg.batch_size):
            out += self._annotate_batch(trajs[start : start + self.cfg.batch_size])
        return out

    def _annotate_batch(self, trajs: Sequence[Trajectory]) -> list[Trajectory]:
        answers: dict[int, TeacherAnnotation] = {}
        reasons: dict[int, str] = {}
        attempts: Counter[int] = Counter()
        # An empty trajectory needs no teacher: its (empty) annotation is trivially right.
        pending = [i for i, t in enumerate(trajs) if t.transitions]
        for attempt in range(self.cfg.retries + 1):
            if not pending:
                break
            if attempt:
                self.stats.counts["retries"] += len(pending)
            attempts.update(pending)
            prompts = [annotation_messages(trajs[i], self.cfg.max_state_chars) for i in pending]
            completions = self._generate(prompts, self._params(attempt))
            still = []
            for i, completion in zip(pending, completions, strict=True):
                if isinstance(completion, str):  # the backend failed for this prompt
                    reasons[i] = completion
                    if completion == "backend_error":  # worth another try; a rejected prompt is not
                        still.append(i)
                    continue
                annotation, reason = parse_annotation(completion.text, len(trajs[i].transitions))
                if annotation is None:
                    truncated = completion.finish_reason == "length"
                    reasons[i] = "truncated" if truncated else reason or "unknown"
                    still.append(i)
                else:
                    answers[i] = annotation
            pending = still
        return [self._finish(t, answers.get(i), reasons.get(i), attempts[i]) for i, t in enumerate(trajs)]

    def _params(self, attempt: int) -> SamplingParams:
        c = self.cfg
        seed = c.seed + attempt * RETRY_SEED_STRIDE
        return SamplingParams(max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p, seed=seed)

    def _generate(self, prompts: list[ChatMessages], params: SamplingParams) -> list[Completion | str]:
        """One completion per prompt, or a failure reason: ``"prompt_rejected"`` (the backend refused the
        request, e.g. longer than the teacher's context: ValueError) or ``"backend_error"`` (a server error or
        timeout). A failed batch is retried prompt by prompt, so one bad prompt does not cost its neighbours."""
        try:
            return list(self.llm.generate(prompts, params))
        except (LLMError, ValueError, RuntimeError) as e:
            if len(prompts) == 1:
                reason = "prompt_rejected" if isinstance(e, ValueError) else "backend_error"
                log.warning("teacher %s: %s", reason, str(e).splitlines()[0] if str(e) else type(e).__name__)
                return [reason]
        out: list[Completion | str] = []
        for i, prompt in enumerate(prompts):
            seed = None if params.seed is None else params.seed + i  # the seed it would have had in the batch
            out += self._generate([prompt], replace(params, seed=seed))
        return out

    def _finish(
        self, traj: Trajectory, answer: TeacherAnnotation | None, reason: str | None, attempts: int
    ) -> Trajectory:
        cut = self.cfg.max_reasoning_chars
        if answer is not None or not traj.transitions:
            plans = {s.step_id: s.transition_plan for s in answer.state_transitions} if answer else {}
            tutorial = answer.task_tutorial.as_dict() if answer else None
            reasoning = [plans[i] for i in range(1, len(traj.transitions) + 1)]
            return apply_annotation(traj, reasoning, self.name, tutorial, cut, self.stats)
        reason = reason or "unknown"
        self.stats.counts[f"fallback:{reason}"] += 1
        log.warning("trajectory %s: teacher answer unusable after %d attempts (%s); fallback", traj.traj_id, attempts, reason)
        if self.cfg.fallback == "rule" and RuleAnnotator.supports(traj):
            e = self.rules.explain(traj)
            out = apply_annotation(traj, e.reasoning, f"rule:{env_of(traj)}", e.task_tutorial, cut, self.stats)
        else:
            out = apply_annotation(traj, [""] * len(traj.transitions), "none", None, cut, self.stats)
        out.meta["annotation_fallback"] = {"from": self.name, "reason": reason, "attempts": attempts}
        return out


# ------------------------------------------------------------------------------------------ files


@dataclass
class FileProgress:
    """Reported after each written batch: trajectories written so far / to write in this run."""

    written: int
    total: int
    skipped: int
    stats: AnnotationStats


def check_output(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> Path:
    """Raise ValueError unless ``out`` is a ``.jsonl`` file that is not one of the inputs."""
    out_path = Path(out)
    if out_path.suffix != ".jsonl":
        raise ValueError(f"{out_path}: annotations are written as JSONL (resumable); use a .jsonl file")
    if any(Path(p).resolve() == out_path.resolve() for p in paths):
        raise ValueError(f"{out_path}: the output must not be one of the input files")
    return out_path


def annotate_file(
    paths: Sequence[str | os.PathLike[str]],
    annotator: Annotator,
    out: str | os.PathLike[str],
    batch_size: int = 16,
    on_progress: Callable[[FileProgress], None] | None = None,
) -> FileProgress:
    """Annotate the trajectories of ``paths`` into the JSONL file ``out``.

    Resumable: trajectories whose ``traj_id`` is already in ``out`` (or earlier in the inputs) are skipped, and
    each batch is appended (flushed, fsynced) as soon as it is annotated.
    """
    out_path = check_output(paths, out)
    trajs = [t for p in paths for t in read_trajectories(p)]  # every file is validated before any work
    if isinstance(annotator, RuleAnnotator):
        unsupported = sorted({env_of(t) for t in trajs if not annotator.supports(t)})
        if unsupported:
            raise DataError(f"no rule-based explainer for env(s) {', '.join(unsupported)}; use the diff or llm "
                            "annotator")
    with JsonlWriter(out_path) as writer:  # opening cuts a torn last line left by a killed run
        seen = {t.traj_id for t in read_jsonl(out_path)}
        todo = []
        for t in trajs:
            if t.traj_id not in seen:
                seen.add(t.traj_id)
                todo.append(t)
        progress = FileProgress(0, len(todo), len(trajs) - len(todo), annotator.stats)
        if on_progress is not None:
            on_progress(progress)
        for batch in _batches(todo, batch_size):
            for traj in annotator.annotate(batch):
                writer.write(traj)
            progress.written += len(batch)
            if on_progress is not None:
                on_progress(progress)
    return progress


def _batches(items: list[Trajectory], size: int) -> Iterator[list[Trajectory]]:
    for start in range(0, len(items), max(1, size)):
        yield items[start : start + size]

