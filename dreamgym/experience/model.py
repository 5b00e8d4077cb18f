"""``ExperienceModel``: the reasoning experience model M_exp, an LLM that plays the environment.

For a batch of steps (one per live episode) it retrieves the top-k most similar real/synthetic transitions
from the replay buffer, builds the protocol prompt (task, history window, neighbours, state, action; see
:mod:`dreamgym.experience.protocol`), generates ``<think>…</think>`` + next state + reward + done in ONE
batched call, and parses. A malformed output is resampled (with temperature) up to ``max_resamples`` times;
what is still malformed becomes the protocol's failure state (state unchanged, reward 0), counted in
``stats``. ``predict`` never raises on model output.

The model directory holds a Hugging Face model plus ``experience.json`` (the protocol it was trained with),
so that inference reads exactly the prompt format training wrote.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ConfigDict, Field

from dreamgym.envs.base import find_spec
from dreamgym.experience.protocol import (
    ExperiencePrediction,
    ExperienceQuery,
    Neighbour,
    ParseResult,
    ParseStats,
    ProtocolConfig,
    build_messages,
    build_prompt_text,
    failure_prediction,
    fit_layout,
    parse_output,
    premise_text,
    repeats_element,
)
from dreamgym.experience.recall import Recall
from dreamgym.experience.reward_head import RewardHead
from dreamgym.llm.base import LLM, Completion, LLMConfig, Prompt, SamplingParams
from dreamgym.llm.load import load_llm

if TYPE_CHECKING:
    from dreamgym.replay import ReplayBuffer

log = logging.getLogger(__name__)
CONFIG_FILE = "experience.json"


class ExperienceConfig(BaseModel):
    """How M_exp is prompted and sampled. ``protocol`` holds the ablation switches (history, k, reasoning)."""

    model_config = ConfigDict(extra="forbid")

    protocol: dict[str, Any] = Field(default_factory=dict, description="ProtocolConfig fields")
    chat: bool = Field(default=True, description="prompt through the chat template (else the plain prompt text)")
    max_new_tokens: int = Field(default=384, ge=8)
    prompt_budget: int | None = Field(
        default=None, ge=1, description="tokens a served prompt is fitted to, as SFT fitted it: the length M_exp was "
        "trained at minus its median target, at most the context minus the 0.99 quantile of its targets (the room to "
        "answer), at least half the trained length; each row then writes up to min(max_new_tokens, context - its "
        "prompt). None: the context minus max_new_tokens, the rule of models trained before 2026-12-06 (it made room "
        "for the longest answer ever seen: on the shop 32% of the served prompts lost their neighbour, against 2.4% "
        "of the trained ones)")
    temperature: float = Field(default=0.0, ge=0, description="0 = greedy (the most likely next state)")
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_resamples: int = Field(default=2, ge=0, description="resamples of a malformed output before the fallback")
    resample_temperature: float = Field(default=0.7, gt=0)
    unique_elements: bool = Field(default=False, description="a next state that lists one element (type and text) "
                                  "twice is malformed: resampled, then the failure state. For envs whose pages never "
                                  "repeat one (TextWorld's: dreamt pages offered the item just taken five times)")
    retrieval_env: str | None = Field(default=None, description="retrieve only transitions of this env")
    env: str | None = Field(default=None, description="the env of the training data (its EnvSpec.trace_checker "
                            "serves ProtocolConfig.checked_verdicts)")
    reward_head: bool = Field(default=False, description="the reward of a step M_exp ends comes from the model dir's "
                              "reward head (dreamgym.experience.reward_head), not from the model's <reward>")

    def protocol_config(self) -> ProtocolConfig:
        # a model saved before the TARGET line existed was trained without it
        # and one saved before session 18 pointed its copy references into the whole query (layout_refs)
        return ProtocolConfig(**{"ground_action": False, "layout_refs": False, **self.protocol})

    @classmethod
    def from_protocol(cls, protocol: ProtocolConfig, **kwargs: Any) -> ExperienceConfig:
        return cls(protocol=protocol.model_dump(), **kwargs)

    def with_protocol(self, **fields: Any) -> ExperienceConfig:
        """This config with ``fields`` of its protocol replaced (e.g. served with ``computed_premises``)."""
        return self.model_copy(update={"protocol": {**self.protocol, **fields}})


def save_experience_config(model_dir: str | os.PathLike[str], cfg: ExperienceConfig) -> None:
    Path(model_dir, CONFIG_FILE).write_text(cfg.model_dump_json(indent=2))


def env_hook(env: str | None, option: str, field: str) -> Any:
    """Env ``env``'s :class:`~dreamgym.envs.base.EnvSpec` ``field``, which ProtocolConfig ``option`` uses; ValueError
    when the env has none."""
    env_spec = find_spec(env) if env else None
    hook = env_spec.load(field) if env_spec is not None else None
    if hook is None:
        raise ValueError(f"{option} needs an env with a {field}; the experience model's env is {env!r}")
    return hook


def read_experience_config(model_dir: str | os.PathLike[str]) -> ExperienceConfig:
    """The ``experience.json`` of a model dir (the defaults where it has none); ValueError naming the file when
    it does not validate."""
    path = Path(model_dir, CONFIG_FILE)
    if not path.exists():
        return ExperienceConfig()
    try:
        return ExperienceConfig.model_validate_json(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: invalid experience config ({str(e).splitlines()[0]})") from None


def neighbours_of(hits: Sequence[Any]) -> list[Neighbour]:
    """Replay-buffer hits (anything with state, action, next_state, reward, done and optionally info and
    instruction) as prompt neighbours. ``done`` shows real endings only, like the targets (:func:`~dreamgym.experience.protocol.terminated`):
    a step cut by the step limit is stored with done=True and ``info["truncated"]``, and is shown with d=0."""
    return [
        Neighbour(h.state, h.action, h.next_state, float(h.reward),
                  bool(h.done) and not (getattr(h, "info", None) or {}).get("truncated", False),
                  getattr(h, "instruction", None))
        for h in hits
    ]


class ExperienceModel:
    """M_exp over any generation backend, with optional replay-buffer retrieval."""

    def __init__(self, llm: LLM, cfg: ExperienceConfig | None = None, buffer: ReplayBuffer | None = None,
                 reward_head: RewardHead | None = None, recall: Recall | None = None) -> None:
        self.llm = llm
        self.recall = recall  # answers the steps the offline data recorded (DreamConfig.recall)
        self.recalled = 0  # ... so many steps, not generated
        self.cfg = cfg or ExperienceConfig()
        if self.cfg.reward_head and reward_head is None:
            raise ValueError("the experience config asks for a reward head (reward_head: true) and none was given")
        self.reward_head = reward_head if self.cfg.reward_head else None
        self.head_rewards = 0  # ending steps whose reward the reward head gave
        self.head_changed = 0  # ... of which it changed the model's own reward
        self.protocol = self.cfg.protocol_config()
        self.buffer = buffer
        self.stats = ParseStats()  # final outcome of every predicted step (ok, or the failure reason served)
        self.resamples = 0  # extra generations spent on malformed outputs
        self.shortened_prompts = 0  # prompts cut to fit the model's context (see fit_context)
        self.checker = self._trace_checker()
        self.checked = 0  # predictions whose trace the env's checker read (checked_verdicts)
        self.recomputed = 0  # ... of which the checker changed the reasoning, reward or next state
        self.rejected = 0  # ... or rejected (a failure: resampled, then served as the failure state)
        self.premise = self._trace_premise()
        self.premised = 0  # generations started from the env's premise (computed_premises)

    def _trace_checker(self) -> Callable[[str, str, ExperiencePrediction], ExperiencePrediction | None] | None:
        if not self.protocol.checked_verdicts:
            return None
        return cast(Callable[[str, str, ExperiencePrediction], "ExperiencePrediction | None"],
                    env_hook(self.cfg.env or self.cfg.retrieval_env, "checked_verdicts", "trace_checker"))

    def _trace_premise(self) -> Callable[[str, str, str], str | None] | None:
        if not self.protocol.computed_premises:
            return None
        premise = env_hook(self.cfg.env or self.cfg.retrieval_env, "computed_premises", "trace_premise")
        if getattr(self.llm, "tokenizer", None) is None or getattr(self.llm, "generate_rows", None) is None \
                or getattr(self.llm, "encode", None) is None:
            raise ValueError("computed_premises starts generation inside the answer: it needs a local (hf) model")
        return cast(Callable[[str, str, str], "str | None"], premise)

    def _premises(self, queries: Sequence[ExperienceQuery], layouts: Sequence[ProtocolConfig]) -> list[str]:
        """Each query's answer opening from the env's premise (``computed_premises``), "" where there is none."""
        if self.premise is None:
            return [""] * len(queries)
        out = []
        for q, layout in zip(queries, layouts, strict=True):
            premise = self.premise(q.instruction, q.state, q.action)
            out.append("" if premise is None else premise_text(premise, q, layout))
        return out

    def _check(self, query: ExperienceQuery, pred: ExperiencePrediction) -> ExperiencePrediction:
        """``pred`` with its trace's verdicts recomputed by the env's checker (``checked_verdicts``), counted."""
        if self.checker is None:
            return pred
        checked = self.checker(query.state, query.action, pred)
        if checked is None:
            return pred
        self.checked += 1
        self.recomputed += checked != pred
        self.rejected += checked.failure is not None
        return checked

    def _head(self, queries: Sequence[ExperienceQuery], preds: list[ExperiencePrediction]) -> list[ExperiencePrediction]:
        """``preds`` with the reward and success of each parsed ending step from the reward head (if any), counted."""
        todo = [i for i, p in enumerate(preds) if p.done and p.failure is None]
        if self.reward_head is None or not todo:
            return preds
        answers = self.reward_head.predict_batch([(queries[i].instruction, queries[i].state) for i in todo])
        out = list(preds)
        for i, (reward, success) in zip(todo, answers, strict=True):
            self.head_rewards += 1
            self.head_changed += abs(reward - preds[i].reward) > 1e-9
            out[i] = dataclasses.replace(preds[i], reward=reward, success=success)
        return out

    @classmethod
    def load(
        cls,
        model: str | os.PathLike[str] | LLMConfig,
        buffer: ReplayBuffer | None = None,
        cfg: ExperienceConfig | None = None,
        device: str = "cpu",
    ) -> ExperienceModel:
        """Load from a model directory (reads its ``experience.json``) or any :class:`LLMConfig` endpoint."""
        if isinstance(model, LLMConfig):
            return cls(load_llm(model), cfg, buffer)
        path = Path(model)
        if cfg is None and (path / CONFIG_FILE).exists():
            cfg = read_experience_config(path)
        head = RewardHead.load(path) if cfg is not None and cfg.reward_head else None
        return cls(load_llm(LLMConfig(backend="hf", model=str(path), device=device)), cfg, buffer, head)

    # ------------------------------------------------------------------------------------------ prompt

    def with_neighbours(
        self, queries: Sequence[ExperienceQuery], exclude_traj: Sequence[str | None] | None = None
    ) -> list[ExperienceQuery]:
        """Fill each query's ``retrieved`` from the buffer (top-k by cosine of φ(state, action)) if empty."""
        k = self.protocol.k
        todo = [i for i, q in enumerate(queries) if not q.retrieved]
        if self.buffer is None or k == 0 or not todo or len(self.buffer) == 0:
            return list(queries)
        excludes = [exclude_traj[i] if exclude_traj else None for i in todo]
        hits = self.buffer.retrieve_batch(
            [(queries[i].state, queries[i].action) for i in todo], k, env=self.cfg.retrieval_env, exclude_traj=excludes,
            same_action_first=self.protocol.same_action_neighbours,
            tasks=[queries[i].instruction for i in todo] if self.protocol.task_neighbours else None,
        )
        out = list(queries)
        for i, h in zip(todo, hits, strict=True):
            out[i] = dataclasses.replace(queries[i], retrieved=neighbours_of(h))
        return out

    def prompt(self, query: ExperienceQuery, protocol: ProtocolConfig | None = None) -> Prompt:
        protocol = protocol or self.protocol
        return build_messages(query, protocol) if self.cfg.chat else build_prompt_text(query, protocol)

    def fit_context(self, query: ExperienceQuery, prompt: Prompt) -> Prompt | None:
        """:meth:`fit_layout`'s prompt (None if not even the shortest layout fits)."""
        fitted = self.fit_layout(query, prompt)
        return None if fitted is None else fitted[1]

    def fit_layout(self, query: ExperienceQuery, prompt: Prompt) -> tuple[ProtocolConfig, Prompt] | None:
        """``prompt`` in the model's layout, or a shorter layout's when it exceeds ``prompt_budget`` (the budget SFT
        fitted prompts to; without one, a local model's context minus ``max_new_tokens``) by
        :func:`~dreamgym.experience.protocol.fit_layout`, the rule SFT truncates by: neighbours first, then
        history, oldest first, then state lines; counted in ``shortened_prompts``, logged. None if even that does
        not fit. Remote backends check for themselves. The layout is what the output's copy references point into."""
        limit = getattr(self.llm, "max_length", None)
        encode = getattr(self.llm, "encode", None)
        if limit is None or encode is None:
            return self.protocol, prompt
        budget = (min(self.cfg.prompt_budget, limit - 1) if self.cfg.prompt_budget is not None
                  else limit - self.cfg.max_new_tokens)
        if len(encode(prompt)) <= budget:
            return self.protocol, prompt
        fitted = fit_layout(query, self.protocol, self.cfg.chat, lambda p: len(encode(p)), budget)
        if fitted is not None:
            self.shortened_prompts += 1
            n = self.shortened_prompts
            if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th, ...: counted every time, logged without flooding
                log.warning("experience model: prompt over its budget (%d tokens); shortened (%d so far)", budget, n)
        return fitted

    def served(self, queries: Sequence[ExperienceQuery]) -> list[tuple[ProtocolConfig, Prompt] | None]:
        """Each query's prompt as served (:meth:`fit_layout`) with the layout its output is parsed against: copy
        references point into the prompt as served (``layout_refs``), else, for models trained before session 18,
        into the whole query (the model's own layout). None where not even the shortest layout fits."""
        fitted = [self.fit_layout(q, self.prompt(q)) for q in queries]
        return [None if f is None else (f[0] if self.protocol.layout_refs else self.protocol, f[1]) for f in fitted]

    # ----------------------------------------------------------------------------------------- predict

    def predict(
        self,
        queries: Sequence[ExperienceQuery],
        exclude_traj: Sequence[str | None] | None = None,
        seed: int | None = None,
    ) -> list[ExperiencePrediction]:
        """Next state, reward and done for each query, in one batched generation (plus resamples); with a
        :class:`~dreamgym.experience.recall.Recall`, the steps it holds are answered from it, not generated."""
        recalled = [None if self.recall is None else self.recall(q) for q in queries]
        todo = [i for i, r in enumerate(recalled) if r is None]
        self.recalled += len(queries) - len(todo)
        if len(todo) < len(queries):
            generated = iter(self._predict([queries[i] for i in todo],
                                           None if exclude_traj is None else [exclude_traj[i] for i in todo], seed))
            return [r if r is not None else next(generated) for r in recalled]
        return self._predict(queries, exclude_traj, seed)

    def _predict(
        self,
        queries: Sequence[ExperienceQuery],
        exclude_traj: Sequence[str | None] | None = None,
        seed: int | None = None,
    ) -> list[ExperiencePrediction]:
        """:meth:`predict` by the model alone."""
        if not queries:
            return []
        queries = self.with_neighbours(queries, exclude_traj)
        fitted = self.served(queries)
        prompts = [f[1] if f is not None else "" for f in fitted]
        layouts = [f[0] if f is not None else self.protocol for f in fitted]
        results: list[ExperiencePrediction | None] = [None] * len(queries)
        reasons: dict[int, str] = {i: "truncated" for i, p in enumerate(fitted) if p is None}  # cannot fit at all
        pending = [i for i, p in enumerate(fitted) if p is not None]
        openings = self._premises(queries, layouts)
        self.premised += sum(bool(openings[i]) for i in pending)
        for attempt in range(1 + self.cfg.max_resamples):
            if not pending:
                break
            temperature = self.cfg.temperature if attempt == 0 else max(self.cfg.temperature, self.cfg.resample_temperature)
            params = SamplingParams(
                max_new_tokens=self.cfg.max_new_tokens,
                temperature=temperature,
                top_p=self.cfg.top_p,
                seed=None if seed is None else seed + 7919 * attempt,
            )
            if attempt:
                self.resamples += len(pending)
            completions = self._generate([prompts[i] for i in pending], params, [openings[i] for i in pending])
            still = []
            for i, c in zip(pending, completions, strict=True):
                parsed = parse_output(openings[i] + c.text, layouts[i], length_limited=c.finish_reason == "length",
                                      query=queries[i])
                if parsed.prediction is not None and self.cfg.unique_elements \
                        and repeats_element(parsed.prediction.next_state):
                    reasons[i] = "repeated_element"
                    still.append(i)
                elif parsed.prediction is not None:
                    checked = self._check(queries[i], parsed.prediction)
                    if checked.failure is not None:  # the env's checker rejects it (e.g. a win the query rules out)
                        reasons[i] = checked.failure
                        still.append(i)
                    else:
                        results[i] = checked
                        self.stats.add(parsed)
                else:
                    reasons[i] = parsed.reason or "empty"
                    still.append(i)
            pending = still
            if not pending:
                break
        pending = sorted([*pending, *(i for i, p in enumerate(fitted) if p is None)])
        for i in pending:
            log.warning("experience model: unparsable output (%s) after %d resamples; serving the failure state",
                        reasons[i], self.cfg.max_resamples)
            results[i] = failure_prediction(queries[i].state, reasons[i])
            self.stats.add(ParseResult(None, reasons[i]))
        return self._head(queries, [r for r in results if r is not None])

    def _generate(self, prompts: list[Prompt], params: SamplingParams, openings: list[str]) -> list[Completion]:
        """``llm.generate``; with ``prompt_budget`` on a local model each row writes at most what its own prompt
        leaves of the context (row i seeded ``params.seed + i``, as in one ``generate`` call). A row with an
        opening (``computed_premises``) starts its answer with it, tokenized as SFT tokenizes a target, and its
        completion is what follows it, within the same ``max_new_tokens`` in all."""
        limit = getattr(self.llm, "max_length", None)
        encode = getattr(self.llm, "encode", None)
        rows = getattr(self.llm, "generate_rows", None)
        if not any(openings) and (self.cfg.prompt_budget is None or limit is None or encode is None or rows is None):
            return self.llm.generate(prompts, params)
        assert encode is not None and rows is not None  # computed_premises checked these at construction
        tokenizer: Any = self.llm.tokenizer if any(openings) else None
        opened = [tokenizer(o, add_special_tokens=False).input_ids if o else [] for o in openings]
        ids = [encode(p) + o for p, o in zip(prompts, opened, strict=True)]
        room = [limit - len(x) if limit is not None and self.cfg.prompt_budget is not None else params.max_new_tokens
                for x in ids]
        per_row = [dataclasses.replace(params, max_new_tokens=max(1, min(params.max_new_tokens - len(o), r)),
                                       seed=None if params.seed is None else params.seed + i)
                   for i, (o, r) in enumerate(zip(opened, room, strict=True))]
        return cast(list[Completion], rows(ids, per_row))

    def stats_dict(self) -> dict[str, Any]:
        out = {**self.stats.as_dict(), "resamples": self.resamples, "shortened_prompts": self.shortened_prompts}
        if self.checker is not None:
            out |= {"checked_verdicts": self.checked, "recomputed_verdicts": self.recomputed,
                    "rejected_by_checker": self.rejected}
        if self.premise is not None:
            out |= {"premised": self.premised}
        if self.recall is not None:
            out |= {"recalled": self.recalled, **({"recalled_effects": self.recall.effects}
                                                  if self.recall.effect is not None else {})}
        if self.reward_head is not None:
            out |= {"head_rewards": self.head_rewards, "head_changed_rewards": self.head_changed}
        return out

    def __repr__(self) -> str:
        return f"ExperienceModel(llm={type(self.llm).__name__}, cfg={json.dumps(self.cfg.model_dump())})"
