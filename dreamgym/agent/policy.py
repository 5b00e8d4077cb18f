"""The LLM agent: the paper's agent prompt, robust action extraction, and batched acting with token ids.

Prompt (chat messages; the paper's App. C agent prompt, made compact for small models):

    system: role + output format
    user:   TASK: <instruction>
            STEP: <n previous steps>
            HISTORY: <last `history_window` actions, oldest first>   (states only for the current step)
            STATE: <current abstract state>
            ACTIONS: <admissible actions, ' | '-separated>          (when `show_admissible`)

Output: ``<think>…</think><action>…</action>`` with thinking optional (off for tiny models), so the target of
behaviour cloning for a step is ``<action>click[b0abc]</action>``. Generation stops at ``</action>``.

``action_format="index"`` (the tiny CPU default) numbers the options and lets the agent answer with a number,
``<action>3</action>``, or with a free-text action where the env allows one (a search query): a from-scratch
3M-parameter model does not learn to copy item ids within a CPU budget (the README's behaviour-cloning table: 0%
test success with text actions), while choosing among numbered options is classification. With
``offer_task_search`` the options also include ``search[<the task instruction>]`` wherever the env offers a
search (it is then always option 1): an agent-side affordance, nothing the env is told. What the env receives
is always the full action text.

``action_format="typed"`` labels each option with the type of the state element it acts on and its rank among
the page's options of that type, ``option 2: click[blue]``, ``button 3: click[buy now]``, ``link 1: click[b0n38atr]``
(an action that names no element: its verb, ``search 1: search[...]``, ``go 2: go north``), and the agent answers
the label, ``<action>option 2</action>``. The first token of the answer is then the kind of element to act on: a
decision a small model can learn without copying a word, where in ``index`` or by-name answers the mass of "click
some option" is spread over option numbers or names and a single button wins greedy decoding (README, "A
word-level tokenizer, longer cloning and typed answers"). The labels come from the prompt's ``[id] type: text`` lines alone, so any env with abstract states
gets them.

``prompt="compact"`` shortens every step's prompt for small models: no system message, a long HISTORY action cut
to 24 characters, and no listed click that a STATE line already shows by its text (answered by name, still cloned
and still offered to guided decoding). ``answer_words`` (with ``answer_by_name``) answers such a click by its words
after a space, ``<action> 12 oz</action>``: under a byte-level BPE those are the tokens the TASK line spells the
same words with, so a small model can copy its answer from the task (README, "Shorter prompts and word answers").

``LLMPolicy.act`` keeps exactly what the model generated (prompt ids, response ids, per-token log-probs) for
RL: nothing is re-tokenised between acting and training.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dreamgym.llm.base import LLM, ChatMessages, SamplingParams

log = logging.getLogger(__name__)

ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SYSTEM_PROMPT = (
    "You are an agent acting in a text environment to complete the task. Each turn you see the current state "
    "(one element per line) and the admissible actions. Reply with {think}<action>{answer}</action>."
)
_ACTION_TAG = re.compile(r"<action>(.*?)(?:</action>|$)", re.DOTALL | re.IGNORECASE)
_BRACKET_ACTION = re.compile(r"\b([a-z_]+\[[^\[\]\n]*\])", re.IGNORECASE)


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    history_window: int = Field(default=3, ge=0, description="previous actions shown in the prompt")
    thinking: bool = Field(default=False, description="ask for <think>…</think> before the action")
    show_admissible: bool = True
    max_admissible: int = Field(default=40, ge=1)
    max_state_chars: int = Field(default=2000, ge=100)
    max_new_tokens: int = Field(default=32, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    invalid_action_penalty: float = Field(default=0.1, ge=0, description="subtracted from an invalid step's reward")
    action_format: Literal["text", "index", "typed"] = Field(
        default="text", description="index: answer an option number; typed: answer an option's label, the type of "
        "the element it acts on and its rank among those (option 2)")
    offer_task_search: bool = Field(default=False, description="add search[<instruction>] where search is offered")
    decoding: Literal["free", "admissible"] = Field(
        default="free", description="admissible: greedy decoding is guided to the answer of one of the admissible "
        "actions (SamplingParams.choices; a token trie), so the policy's argmax can never be an invalid action")
    sampling: Literal["free", "admissible"] = Field(
        default="free", description="admissible: sampling (RL rollouts) draws each token from the policy's "
        "distribution renormalised over the tokens that continue an admissible action's answer (invalid action "
        "masking); each step keeps those token sets, and RL scores its tokens under the same mask (RLConfig."
        "action_masking sets it)")
    prompt: Literal["full", "compact"] = Field(
        default="full", description="compact: no system message, a long action in HISTORY cut to its first words "
        "(the task's search), and the ACTIONS list without the actions answered by name that click a STATE line by "
        "its text (options, buttons: the line already shows them): about a third fewer tokens per shop step, so "
        "more cloning steps in the same seconds")
    answer_by_name: bool = Field(default=False, description="index format: clone a short word action (an option, a "
                                 "button: see is_word_action) as its text, and only ids and long actions as option "
                                 "numbers")
    answer_words: bool = Field(default=False, description="with answer_by_name: a word click (an option, a button: "
                               "is_word_action) is answered by its words alone after a space, <action> 12 oz</action>: the "
                               "tokens the TASK line spells the same words with under a byte-level BPE (after "
                               "'click[' the same words are other tokens), so the answer can be copied from the task")

    @model_validator(mode="after")
    def _words_need_names(self) -> PolicyConfig:
        if self.answer_words and not (self.action_format == "index" and self.answer_by_name):
            raise ValueError("answer_words words the answers of answer_by_name: it needs action_format='index' and "
                             "answer_by_name=true")
        return self


@dataclass(frozen=True)
class AgentObservation:
    """What the agent sees at one step of one episode."""

    instruction: str
    state: str
    admissible_actions: Sequence[str]
    history: Sequence[tuple[str, str]]  # previous (state, action) pairs, oldest first


@dataclass
class PolicyStep:
    action: str  # the parsed action ("" when nothing parsable was generated: the env flags it invalid)
    parsed: bool
    text: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    weight_version: int | None = None  # the served weights that generated it (a server that reports it)
    allowed_ids: list[list[int]] | None = None  # sampling="admissible": per response token, the ids it was drawn among


def agent_options(obs: AgentObservation, cfg: PolicyConfig) -> list[str]:
    """The actions shown to the agent (numbered in ``index`` format), in the env's order."""
    options = list(obs.admissible_actions)[: cfg.max_admissible]
    if cfg.offer_task_search and any(a.startswith("search[") for a in options):
        task_search = f"search[{' '.join(obs.instruction.split())}]"
        options = [task_search, *[a for a in options if a != task_search]]
    return options


def shown_state(obs: AgentObservation, cfg: PolicyConfig) -> str:
    """The STATE the prompt shows: cut to ``max_state_chars``."""
    return obs.state if len(obs.state) <= cfg.max_state_chars else obs.state[: cfg.max_state_chars] + " …"


def listed_options(obs: AgentObservation, cfg: PolicyConfig) -> list[str]:
    """The actions the prompt lists (and numbers, in ``index`` format): :func:`agent_options`, less, with
    ``prompt="compact"``, each action answered by its text that clicks a STATE line by that line's text (the line
    shows it already; ``action_target`` still clones it, and guided decoding still offers it)."""
    options = agent_options(obs, cfg)
    if cfg.prompt != "compact":
        return options
    texts = [text for _, text in state_elements(shown_state(obs, cfg))]
    return [a for a in options if not (answered_by_name(a, cfg) and _shows_click(a, texts))]


def answered_by_name(action: str, cfg: PolicyConfig) -> bool:
    """Whether the agent answers ``action`` with its text (or, with ``answer_words``, its words), not a number or a
    label: every action in ``text`` format, a word action (:func:`is_word_action`) with ``answer_by_name``."""
    return cfg.action_format == "text" or (cfg.action_format == "index" and cfg.answer_by_name and
                                           is_word_action(action))


def _shows_click(action: str, texts: Sequence[str]) -> bool:
    """``action`` is ``click[x]`` and a STATE line's (lower-case) text shows ``x``: its whole text, or an option's
    ``name=x`` (selected or not)."""
    arg = _click_arg(action)
    return arg is not None and any(text == arg.lower() or text.removesuffix(" (selected)").endswith("=" + arg.lower())
                                   for text in texts)


def _history_action(action: str, cfg: PolicyConfig) -> str:
    """An action as HISTORY shows it: whole; with ``answer_words``, a word click as the words the agent answered
    (so a repeat of the last answer is the same tokens as its HISTORY entry); with ``prompt="compact"`` cut to
    24 characters (the task's search query is the TASK line again)."""
    arg = _click_arg(action)
    if cfg.answer_words and arg is not None and answered_by_name(action, cfg):
        return arg
    if cfg.prompt != "compact" or len(action) <= 24:
        return action
    return action[:22] + ("…]" if action.endswith("]") else "…")


_ELEMENT = re.compile(r"^\[[^\]]*\]\s*([A-Za-z_][\w -]*?)\s*:\s*(.*)$")
_LABEL = re.compile(r"^([a-z_][\w-]*) (\d+)$")


def element_type(action: str, elements: Sequence[tuple[str, str]]) -> str:
    """The type of the element ``action`` acts on, among a state's ``(type, text)`` elements (lower case, from its
    ``[id] type: text`` lines): ``click[x]`` on the element whose text is ``x``, ends with ``=x`` or starts with
    ``x`` and a space (an id's link); an action whose verb opens an element's text (``search[...]`` on
    ``searchbox: search[your query]``) on that element. Else the action's verb (``search``, ``take``): the word
    before ``[`` or the first word."""
    verb = action.split("[", 1)[0] if "[" in action else action.split(" ", 1)[0]
    if action.endswith("]") and "[" in action:
        arg, opens = action[len(verb) + 1 : -1].lower(), verb.lower() + "["
        for kind, text in elements:
            if text == arg or text.endswith("=" + arg) or text.startswith((arg + " ", opens)):
                return kind
    return verb.strip().lower() or "action"


def state_elements(state: str) -> list[tuple[str, str]]:
    """A state's ``[id] type: text`` lines as lower-case ``(type, text)`` pairs (spaces in a type become ``_``)."""
    return [(m.group(1).strip().lower().replace(" ", "_"), m.group(2).strip().lower())
            for m in map(_ELEMENT.match, (line.strip() for line in state.splitlines())) if m is not None]


def action_labels(obs: AgentObservation, cfg: PolicyConfig) -> list[str]:
    """``typed`` format: each of :func:`agent_options`' label, ``<element type> <rank among that type>``."""
    elements = state_elements(obs.state)
    seen: dict[str, int] = {}
    labels = []
    for a in agent_options(obs, cfg):
        kind = element_type(a, elements)
        seen[kind] = seen.get(kind, 0) + 1
        labels.append(f"{kind} {seen[kind]}")
    return labels


def build_agent_prompt(obs: AgentObservation, cfg: PolicyConfig) -> ChatMessages:
    think = "<think>REASONING</think>" if cfg.thinking else ""
    lines = [f"TASK: {obs.instruction}", f"STEP: {len(obs.history)}"]
    recent = list(obs.history)[-cfg.history_window :] if cfg.history_window else []
    if recent:
        lines.append("HISTORY: " + " ; ".join(_history_action(a, cfg) for _, a in recent))
    lines.append("STATE:\n" + shown_state(obs, cfg))
    options = listed_options(obs, cfg)
    if cfg.action_format == "index" and options:
        lines.append("ACTIONS:\n" + "\n".join(f"{i} {a}" for i, a in enumerate(options, start=1)))
    elif cfg.action_format == "typed" and options:
        lines.append("ACTIONS:\n" + "\n".join(f"{lab}: {a}" for lab, a in zip(action_labels(obs, cfg), options,
                                                                              strict=True)))
    elif cfg.show_admissible and options:
        lines.append("ACTIONS: " + " | ".join(options))
    answer = {"index": "the number of an action, or an action", "typed": "the label of an action, or an action"}.get(
        cfg.action_format, "ACTION")
    user = {"role": "user", "content": "\n".join(lines)}
    if cfg.prompt == "compact":
        return [user]
    return [{"role": "system", "content": SYSTEM_PROMPT.format(think=think, answer=answer)}, user]


def format_action_target(action: str, thought: str | None = None) -> str:
    """The completion a policy should write for ``action`` (the behaviour-cloning target)."""
    think = f"{THINK_OPEN}{thought}{THINK_CLOSE}" if thought else ""
    return f"{think}{ACTION_OPEN}{action}{ACTION_CLOSE}"


def action_target(obs: AgentObservation, action: str, cfg: PolicyConfig, thought: str | None = None) -> str:
    """The behaviour-cloning target for taking ``action`` at ``obs``: its option number in ``index`` format
    when it is one of the options, its label in ``typed`` format, else the action text."""
    if cfg.action_format == "typed":
        for option, label in zip(agent_options(obs, cfg), action_labels(obs, cfg), strict=True):
            if option.lower() == action.lower():
                return format_action_target(label, thought)
    arg = _click_arg(action)
    if cfg.answer_words and arg is not None and answered_by_name(action, cfg):
        return format_action_target(" " + arg, thought)
    if cfg.action_format == "index" and not answered_by_name(action, cfg):
        options = [a.lower() for a in listed_options(obs, cfg)]
        if action.lower() in options:
            return format_action_target(str(options.index(action.lower()) + 1), thought)
    return format_action_target(action, thought)


_ID_LIKE = re.compile(r"(?=[a-z]*\d)(?=\d*[a-z])[a-z0-9]{6,}", re.IGNORECASE)  # b0n38atr, not "3 seater"


def _click_arg(action: str) -> str | None:
    """``x`` of ``click[x]``; None for any other action."""
    return action[6:-1] if action.startswith("click[") and action.endswith("]") else None


def is_word_action(action: str) -> bool:
    """A short action that names words, not an id (``click[queen]``, ``click[3 seater]``, ``click[buy now]``):
    at most 24 characters, no run of 6+ letters and digits mixed. Writing one out asks a model to match words of
    the task and the state; naming an id (``click[b0n38atr]``) or a long query asks it to copy many characters,
    which a small model without copying cannot (README)."""
    return len(action) <= 24 and _ID_LIKE.search(action) is None


def resolve_action(answer: str, options: Sequence[str]) -> str | None:
    """An answer that is an option number becomes that option; a number out of range is None."""
    if answer.isdigit():
        n = int(answer)
        return options[n - 1] if 1 <= n <= len(options) else None
    return answer


def parse_action(text: str) -> str | None:
    """The action in a completion: the content of the last ``<action>`` tag (closed or cut by the stop
    string), else the last ``verb[arg]`` in the text; None when there is none. Never raises. (In ``index``
    format the content may be an option number: see :func:`resolve_action`.)"""
    tagged = [m.strip() for m in _ACTION_TAG.findall(text) if m.strip()]
    if tagged:
        return tagged[-1]
    after_think = text.rsplit(THINK_CLOSE, 1)[-1]
    found = _BRACKET_ACTION.findall(after_think)
    return found[-1].strip() if found else None


def env_action(text: str, obs: AgentObservation, cfg: PolicyConfig) -> str | None:
    """The env action an LLM output names, read as :class:`LLMPolicy` reads it (:func:`parse_action`, then an
    option number resolved in ``index`` format); None when it names none. The adapters for other engines use it
    too, so a policy is read the same way wherever it is trained."""
    action = parse_action(text)
    if action is not None and cfg.action_format == "index":
        tags = _ACTION_TAG.findall(text) if cfg.answer_words else []
        words = tags[-1] if tags else ""
        if words.startswith(" ") and words.strip() and "[" not in words:  # answer_words: the click naming them
            action = next((a for a in agent_options(obs, cfg) if (_click_arg(a) or "").lower() == action.lower()),
                          action)
        else:
            action = resolve_action(action, listed_options(obs, cfg))
    elif action is not None and cfg.action_format == "typed" and _LABEL.match(action.lower()):
        labels = action_labels(obs, cfg)  # a label names its option; a label the page lacks names nothing
        action = agent_options(obs, cfg)[labels.index(action.lower())] if action.lower() in labels else None
    return action


def on_policy_config(
    cfg: PolicyConfig, temperature: float, invalid_action_penalty: float, top_p: float = 1.0,
    action_masking: bool = False,
) -> PolicyConfig:
    """``cfg`` with an on-policy RL run's sampling: its temperature and penalty, ``sampling`` and ``decoding``
    ``"admissible"`` with ``action_masking`` (a policy trained under the mask acts under it, its evaluations too;
    without it the saved ``sampling`` is reset to free), and ``top_p`` (1.0: RL config
    validation refuses anything else). A policy cloned with ``top_p < 1`` samples from a truncated
    distribution, while the loss scores the tokens under the full softmax, so keeping the saved value would
    bias every policy gradient; overriding it is logged."""
    if cfg.top_p != top_p:
        log.warning("policy sampling: the loaded policy's top_p=%g is replaced by top_p=%g for on-policy RL (the "
                    "loss scores tokens under the untruncated distribution)", cfg.top_p, top_p)
    if action_masking and cfg.thinking:
        raise ValueError("action masking guides the answer tokens, and this policy thinks first; use thinking=false")
    masked: dict[str, Any] = {"sampling": "admissible", "decoding": "admissible"} if action_masking else {
        "sampling": "free"}
    return cfg.model_copy(update={"temperature": temperature, "invalid_action_penalty": invalid_action_penalty,
                                  "top_p": top_p, **masked})


class LLMPolicy:
    """Acts for many episodes at once with one batched generation call."""

    def __init__(self, llm: LLM, cfg: PolicyConfig | None = None) -> None:
        self.llm = llm
        self.cfg = cfg or PolicyConfig()
        self.name = "llm"
        self.unparsed = 0  # counted fallback: completions with no action in them
        self.shortened = 0  # counted fallback: prompts cut to fit the model's context (see fit_prompt)

    def sampling(self, greedy: bool, seed: int | None) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.cfg.max_new_tokens,
            temperature=0.0 if greedy else self.cfg.temperature,
            top_p=self.cfg.top_p,
            stop=(ACTION_CLOSE,),
            seed=seed,
            logprobs=not greedy,
        )

    def fit_prompt(self, obs: AgentObservation) -> ChatMessages:
        """The agent prompt of ``obs``, cut to fit the model's context when it does not: the state to half its
        characters, again and again (down to 100), then the action list likewise. A real env's pages fit; a
        dream's page is what M_exp wrote and may run long, and a policy must act on it rather than fail the run.
        Counted in ``shortened`` and logged at each doubling."""
        prompt = build_agent_prompt(obs, self.cfg)
        limit, encode = getattr(self.llm, "max_length", None), getattr(self.llm, "encode", None)
        if limit is None or encode is None:
            return prompt
        budget = limit - self.cfg.max_new_tokens
        # a token is at least one byte (the chat template's own markers: a few tokens each): it fits as it is
        if sum(len(m["content"].encode()) for m in prompt) + 64 <= budget:
            return prompt
        cfg = self.cfg
        while len(encode(prompt)) > budget:
            if cfg.max_state_chars > 100:
                cfg = cfg.model_copy(update={"max_state_chars": max(100, cfg.max_state_chars // 2)})
            elif cfg.max_admissible > 1:
                cfg = cfg.model_copy(update={"max_admissible": max(1, cfg.max_admissible // 2)})
            else:
                break  # the TASK line alone is too long: the model says so
            prompt = build_agent_prompt(obs, cfg)
        if cfg is not self.cfg:
            self.shortened += 1
            if self.shortened & (self.shortened - 1) == 0:
                log.warning("policy: prompt too long for the context (%d tokens); state and actions cut to %d "
                            "characters and %d actions (%d so far)", limit, cfg.max_state_chars,
                            cfg.max_admissible, self.shortened)
        return prompt

    def choices(self, obs: AgentObservation) -> tuple[str, ...] | None:
        """The answers guided decoding is restricted to, one per admissible action (the completion
        :func:`action_target` clones for it); None without admissible actions or with thinking."""
        if self.cfg.thinking or not obs.admissible_actions:
            return None
        return tuple(dict.fromkeys(action_target(obs, a, self.cfg) for a in agent_options(obs, self.cfg)))

    def generate(self, prompts: list[ChatMessages], batch: Sequence[AgentObservation], params: SamplingParams) -> list[Any]:
        """One batched call; guided decoding (``decoding`` when greedy, ``sampling`` when sampling, set to
        ``"admissible"``) gives each row its own choices, and row ``i`` the seed ``seed + i`` as in an unguided
        call (a backend without per-row parameters is called row by row)."""
        guided = self.cfg.decoding if params.temperature == 0 else self.cfg.sampling
        if guided == "free":
            return self.llm.generate(prompts, params)
        rows = [replace(params, choices=self.choices(o), seed=None if params.seed is None else params.seed + i)
                for i, o in enumerate(batch)]
        generate_rows, encode = getattr(self.llm, "generate_rows", None), getattr(self.llm, "encode", None)
        if generate_rows is not None and encode is not None:
            return list(generate_rows([encode(p) for p in prompts], rows))
        return [self.llm.generate([p], r)[0] for p, r in zip(prompts, rows, strict=True)]

    def act(self, batch: Sequence[AgentObservation], greedy: bool = False, seed: int | None = None) -> list[PolicyStep]:
        prompts = [self.fit_prompt(o) for o in batch]
        completions = self.generate(prompts, batch, self.sampling(greedy, seed))
        steps = []
        for o, c in zip(batch, completions, strict=True):
            action = env_action(c.text, o, self.cfg)
            if action is None:
                self.unparsed += 1
            steps.append(
                PolicyStep(
                    action=action or "",
                    parsed=action is not None,
                    text=c.text,
                    prompt_ids=list(c.prompt_ids or []),
                    response_ids=list(c.token_ids),
                    logprobs=c.logprobs,
                    weight_version=c.weight_version,
                    allowed_ids=c.allowed_ids,
                )
            )
        return steps


# ------------------------------------------------------------------------------------------- run dirs
# A policy run directory holds `model/` (a Hugging Face model dir: safetensors + tokenizer) and
# `policy.json` (the PolicyConfig it was trained with), plus whatever the job that made it records
# (`summary.json`, checkpoints, tensorboard logs).


def save_policy(run_dir: str | os.PathLike[str], model: Any, tokenizer: Any, cfg: PolicyConfig) -> Path:
    run = Path(run_dir)
    model_dir = run / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    (run / "policy.json").write_text(cfg.model_dump_json(indent=2))
    return model_dir


def load_policy(run_dir: str | os.PathLike[str], device: str = "cpu", cfg: PolicyConfig | None = None,
                dtype: str = "float32") -> LLMPolicy:
    """Load a policy run directory (or a bare HF model dir/name, with the default PolicyConfig)."""
    from dreamgym.llm.hf import HFLLM

    run = Path(run_dir)
    model_dir = run / "model" if (run / "model").is_dir() else run
    local = run.exists() or os.sep in str(run_dir)  # otherwise a hub name
    if local:
        check_model_dir(model_dir)
    if cfg is None and (run / "policy.json").exists():
        cfg = PolicyConfig.model_validate_json((run / "policy.json").read_text())
    try:
        llm = HFLLM.from_pretrained(model_dir, device=device, dtype=dtype)
    except (OSError, RuntimeError, ValueError) as e:
        if not local:
            raise
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{model_dir}: cannot load the model ({first})") from None
    return LLMPolicy(llm, cfg)


def check_model_dir(model_dir: Path) -> None:
    """A one-line error naming what is missing or broken in a local model directory, before loading it."""
    import json

    from safetensors import safe_open

    if not model_dir.is_dir():
        raise ValueError(f"{model_dir}: no such policy or model directory")
    config = model_dir / "config.json"
    if not config.is_file():
        raise ValueError(f"{model_dir}: no config.json, so not a model directory (dreamgym baseline sft or "
                         "dreamgym model init makes one)")
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{config}: not valid JSON ({str(e).splitlines()[0]})") from None
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        if not any(model_dir.glob("*.safetensors")) and not (model_dir / "pytorch_model.bin").is_file():
            raise ValueError(f"{model_dir}: no model weights (model.safetensors)")
        return
    try:
        with safe_open(str(weights), framework="pt"):  # checks the header's offsets against the file's size
            pass
    except Exception as e:  # safetensors raises its own SafetensorError (not exported in every version)
        raise ValueError(f"{weights}: unreadable ({str(e).splitlines()[0]}); the file is truncated or corrupt") from None
