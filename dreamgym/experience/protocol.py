"""The experience model's text protocol: the prompt it reads, the target it writes, a parser that never raises.

One protocol serves every backend (a 3–5M from-scratch model on CPU, a 7B instruct model on GPU), so it is
compact, strict to parse, and readable through a chat template.

Prompt (user message; sections with no content are left out; ``build_prompt_text`` prefixes the system text)::

    TASK: i need a slim fit t-shirt, and price lower than 30 dollars
    HISTORY:
    #1 search[slim fit t-shirt]              (previous actions, absolute step numbers; with
    #2 click[B0K2Q9ZD]                        ``history_states`` each is preceded by its state lines)
    SIMILAR:
    (1)                                       (a retrieved real transition: state → action ⇒ next state;
    [1] text: Page 1 (results 1-5 of 50)      ``neighbour_states=False`` leaves its state out)
    [4] link: B0A1B2C3 — Qualo Slim Fit T-Shirt, Crew Neck | $19.99
    → click[B0A1B2C3]
    ⇒
    [1] text: B0A1B2C3 — Qualo Slim Fit T-Shirt, Crew Neck
    [2] text: Price: $19.99
    [3] button: Buy Now
    | r=0.00 d=0
    STATE:
    [1] text: B0K2Q9ZD — Ravemi Slim Fit T-Shirt, Cotton
    [2] option: size=m
    [3] button: Buy Now
    ACTION: click[m]
    TARGET: [2] option: size=m                (the element the action names; see :func:`action_target`)

Long states are cut at whole lines, ending with a ``…`` line (see :func:`truncate_lines`).

Target (what M_exp writes; ``format_target``)::

    <think>{reasoning}</think>
    <state>
    {next state, one element per line}
    </state>
    <reward>0.75</reward> <done>1</done> <success>0</success>

The reward is written with 2 decimals. Without reasoning (the "without reasoning" ablation) the first line is
absent. Grammar accepted by :func:`parse_output` (tags are case-insensitive and may hold spaces: ``< State >``)::

    output  := [preamble] [think] [gap] state [gap] reward [gap] done [gap] success [trailing junk]
    think   := "<think>" TEXT "</think>"                TEXT up to the first "</think>"; tags inside are text
    state   := "<state>" TEXT "</state>"                stripped; must be non-empty; no tag inside
    reward  := "<reward>" FLOAT "</reward>"             decimal or exponent notation, finite, 0 <= r <= 1
    done    := "<done>" BOOL "</done>"                  BOOL: 0 | 1 | true | false (any case), spaces around
    success := "<success>" BOOL "</success>"            success=1 requires done=1

Text before the first tag and between blocks (no tag in it) is ignored, as is everything after
``</success>``. The output is first cut at the first stop-token text (``<|im_end|>``, ``</s>``, ...).
``<think>`` is required when ``cfg.reasoning`` is True and accepted when it is False. A failure carries one
reason from :data:`FAILURE_REASONS`; the dream env then serves :func:`failure_prediction` and counts it in
:class:`ParseStats`.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dreamgym.envs.base import TRUNCATION_MARK, Element
from dreamgym.experience.copyrefs import RefContext, encode_inline, encode_refs, expand_inline, expand_refs
from dreamgym.types import ExperiencePrediction

if TYPE_CHECKING:
    from dreamgym.types import Trajectory, Transition

log = logging.getLogger(__name__)

TAGS = ("think", "state", "reward", "done", "success")
# The tag texts, e.g. for a from-scratch tokenizer to add as single tokens.
TAG_TEXTS = tuple(text for tag in TAGS for text in (f"<{tag}>", f"</{tag}>"))
# Stop-token texts of common chat templates; a backend that leaves them in the output is tolerated.
STOP_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "<end_of_turn>", "</s>", "<eos>")

FAILURE_REASONS: tuple[str, ...] = (
    "empty",  # nothing but whitespace (or a stop token) came back
    "truncated",  # the output ends inside a block or in a half-written tag, or the backend hit its token limit
    *(f"missing_{t}" for t in TAGS),  # a required block is absent
    *(f"duplicate_{t}" for t in TAGS),  # a block is written twice (or out of order after it was consumed)
    *(f"unclosed_{t}" for t in TAGS[1:]),  # a block opens, then another tag comes before its closing tag
    "empty_state",
    "bad_reward",  # not a finite decimal number
    "reward_out_of_range",  # a number outside [0, 1]
    "bad_done",
    "bad_success",
    "success_not_done",  # success=1 on a step that does not end the episode
    "bad_ref",  # copy_refs: a reference to a line or part the prompt does not have
    "repeated_element",  # ExperienceConfig.unique_elements: the next state lists one element (type and text) twice
)


def repeats_element(state: str) -> bool:
    """Whether ``state`` lists one ``[id] type: text`` element's type and text under two ids."""
    seen = [(e.type, e.text) for e in map(Element.parse, state.splitlines()) if e is not None]
    return len(seen) != len(set(seen))


# ------------------------------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class Neighbour:
    """A transition retrieved from the replay buffer, shown to M_exp as an example (the D_k of the paper)."""

    state: str
    action: str
    next_state: str
    reward: float
    done: bool
    instruction: str | None = None  # the task it was recorded in, where known (ProtocolConfig.exact_neighbours)

    @classmethod
    def from_transition(cls, t: Transition) -> Neighbour:
        """``done`` is :func:`terminated`, as in the targets: a step-limit cut is not shown as an ending."""
        return cls(t.state, t.action, t.next_state, t.reward, terminated(t))


@dataclass
class ExperienceQuery:
    """Everything M_exp sees at step t: task τ, history H_t (oldest first), neighbours D_k, s_t and a_t."""

    instruction: str
    history: list[tuple[str, str]]
    retrieved: list[Neighbour]
    state: str
    action: str

    @classmethod
    def at_step(cls, traj: Trajectory, t: int, retrieved: Sequence[Neighbour] = ()) -> ExperienceQuery:
        """The query for step ``t`` of a recorded trajectory (for SFT pairs and fidelity evaluation)."""
        if not 0 <= t < len(traj.transitions):
            raise IndexError(f"step {t} out of range for a trajectory of {len(traj.transitions)} steps")
        history = [(x.state, x.action) for x in traj.transitions[:t]]
        now = traj.transitions[t]
        return cls(traj.task.instruction, history, list(retrieved), now.state, now.action)


DEFAULT_SYSTEM_PROMPT = (
    "You are the environment simulator. Given the task, the recent history, similar past transitions, "
    "the current state and the agent's action, predict what the environment shows next. "
    "{think}Write the next state inside <state>...</state>, one element per line as in STATE, copying ids and "
    "text exactly; then <reward>r</reward> <done>0|1</done> <success>0|1</success> with r in [0, 1] written "
    "with 2 decimals. An action that cannot be carried out leaves the state unchanged with reward 0."
)
THINK_INSTRUCTION = "First write <think>brief reasoning about the action's effect</think>. "
EXACT_NEIGHBOURS_INSTRUCTION = (
    "A similar transition headed 'same task, state and action' is this very step as the environment once answered it."
)
SAME_ACTION_INSTRUCTION = (
    "A similar transition headed 'same action' took this step's action elsewhere: the page an action opens may be "
    "the same from anywhere."
)
COPY_REFS_INSTRUCTION = (
    "Instead of repeating text from the prompt, point at it: a line '@3-7' stands for STATE lines 3 to 7, '@3-' "
    "for line 3 to the last, '@n1:2' "
    "for line 2 of similar transition (1)'s next state; inline, '@T.0' is the TARGET element's text and '@T.1', "
    "'@T.2', ... its parts between ' — ', ' | ' and ': ', '@4.1' a part of STATE line 4; write a literal @ as @@."
)
TASK_NEIGHBOURS_INSTRUCTION = (
    "A similar transition headed 'same task and action' took this step's action in this task from another state: what "
    "the action shows of what was hidden may be the same."
)
NEIGHBOUR_CHANGES_INSTRUCTION = "A similar transition shows only the lines its next state added to its state."
ELEMENT_REFS_INSTRUCTION = "A line '[c4] @[c2]' is STATE element [c2] under the id c4."


class ProtocolConfig(BaseModel):
    """What the prompt shows and what the target holds. The defaults suit both the tiny and the 7B model."""

    model_config = ConfigDict(extra="forbid")

    history_window: int = Field(default=3, ge=0)  # previous steps shown; 0 = the "without history" ablation
    history_states: bool = False  # show previous states too (costly), or only previous actions
    k: int = Field(default=2, ge=0)  # retrieved neighbours shown; 0 = the "without replay" ablation
    neighbour_states: bool = True  # show each neighbour's state, or only its action, next state and outcome
    reasoning: bool = True  # False = the "without reasoning" ablation: no <think> block in the target
    max_state_chars: int | None = Field(default=1200, ge=1)  # limit for the current (and history) states; None = no limit
    max_neighbour_chars: int | None = Field(default=600, ge=1)  # limit for each neighbour's state and next state (a
    # shop item page is up to ~540 characters; a cut next state is no longer something to copy)
    system_prompt: str | None = None  # None: DEFAULT_SYSTEM_PROMPT for this config; "" = no system text
    ground_action: bool = True  # add a TARGET line: the state element the action names (see action_target)
    # The target points at prompt text it repeats (@3-7, @T.1, ...) and the parser writes it in
    # (dreamgym.experience.copyrefs): a model that cannot yet copy only has to choose what to copy.
    copy_refs: bool = False
    # A reference points only at text the prompt as served shows: when a prompt is shortened (a neighbour dropped,
    # the state cut), its target is re-encoded against that layout (retarget) and the output is expanded against it.
    # False, the rule of models trained before 2026-12-06 (session 18): targets pointed into the whole query, so a
    # model whose prompt lost its exact neighbour was still taught to write '@n1:...', and the dream pasted in
    # whatever its retrieved neighbour's page was.
    layout_refs: bool = True
    # With copy_refs, an element the STATE shows under another id is written '[c4] @[c2]' (its type and text
    # copied, dreamgym.experience.copyrefs): for pages whose ids are positions, where a new element renumbers the
    # ones after it. False, the rule of models trained before 2026-12-06 (session 21).
    element_refs: bool = False
    # A neighbour recorded in the query's task with its state and action is headed "(i) same task, state and action",
    # and in training an example may retrieve another trajectory's copy of its own transition
    # (dreamgym.experience.train.exp_queries). The dream meets such exact neighbours on the steps of a real task that
    # the offline data played (the same search, the same click); without this, training never shows one (its own
    # key is excluded) and the model writes the page anew.
    exact_neighbours: bool = False
    # Neighbours that took the query's very action come first (ReplayBuffer.retrieve_batch's same_action_first), in
    # training and in the dream alike. A page an action opens (a product's item page, a search's results) is the
    # same from wherever it is clicked, and the offline data holds it for most actions the dream takes, but φ's
    # nearest neighbour is usually the same page's other clicks: on the shop, 80 of 155 dreamt item-page clicks
    # retrieved one with the same action at k=1, and no dreamt item page listed its product's options. Such a
    # neighbour is headed "(i) same action", so the model need not compare the two actions itself to know.
    same_action_neighbours: bool = False
    # The verdicts of a dreamt reasoning trace (a purchase's "y"/"n" checks, its score and so its reward) are
    # recomputed from the text the trace compares, by the env's EnvSpec.trace_checker (ExperienceModel.predict):
    # the model only has to write what to compare. It changes no prompt or target, only how an output is read.
    checked_verdicts: bool = False
    # The start of a trace that the env's explainer computes from the query alone (EnvSpec.trace_premise: TextWorld's
    # recipe traces say which ingredients are carried and which are missing) is written by the env, and the model
    # writes its trace on from there (ExperienceModel.predict): the 1.3M M_exp copies the recipe but does not work
    # out what is missing. Training checks that the data's traces start with the premises (train_experience_model).
    # It changes no prompt or target, only where generation starts.
    computed_premises: bool = False
    # A prompt over its token budget loses its history (oldest first) before its neighbours (shorter_layouts). The
    # retrieved real transition is the prompt's only source of what the state hides (what TextWorld's fridge holds
    # until it is opened): at a 512-token budget 12 of 1,439 TextWorld training prompts kept it, 1,281 their whole
    # history (benchmarks/results/prompt_layouts_textworld_swap.json). False: neighbours first, the rule so far.
    cut_history_first: bool = False
    # Neighbours recorded in the query's task that took its action come first (ReplayBuffer.retrieve_batch's tasks),
    # in training (another episode's) and in the dream alike, headed "(i) same task and action". What a TextWorld game
    # hides until an action shows it (what its fridge holds) is the same whenever the game takes that action, but φ
    # of a dreamt state found the game's own rows for 2 of 166 dreamt opens the data never took from that state
    # (it opened the same container in the same game for 126). Of those rows the real ones come first: the dream's
    # own rows of the task, which go back into the buffer, only after them.
    task_neighbours: bool = False
    # Each neighbour's next state is shown as the lines its state lacks (added_lines: an element its state lists
    # under any id is not new), so that it fits: a whole TextWorld page is ~300 tokens of a 512-token prompt budget,
    # and the retrieved transition was the first thing cut (12 of 1,439 training prompts kept it).
    neighbour_changes: bool = False
    # A prompt over its token budget cuts its last neighbour's page to fewer whole lines (its first lines kept:
    # TextWorld's feedback of an open, then its new commands) before dropping it (shorter_layouts). A 512-token
    # TextWorld prompt holds the task (~85 tokens) and the state (~320) before any neighbour, and a whole open's new
    # lines (~200) rarely fit: with the history cut first, 111 of 1,439 training prompts kept the same game's
    # neighbour (benchmarks/results/prompt_layouts_textworld_task_changes_history_first.json).
    cut_neighbour_page: bool = False
    # The TASK line last in the user message, right before the output, instead of first: the copy-first base writes
    # the page's price in 20-30 of 31 val purchase traces and the task's price bound in 0-2, so is it the distance?
    # No: from the shipped base, 3 seeds on val, nothing moves (terminal reward accuracy -0.011 +- 0.046, the task's
    # attributes still right in 0 of 31; benchmarks/results/task_reading_val.json). Off.
    task_last: bool = False

    @model_validator(mode="after")
    def _element_refs_need_copy_refs(self) -> ProtocolConfig:
        if self.element_refs and not self.copy_refs:
            raise ValueError("element_refs is a kind of copy reference: set copy_refs too")
        if self.computed_premises and not self.reasoning:
            raise ValueError("computed_premises start the reasoning trace: it needs reasoning")
        return self

    def system_text(self) -> str:
        if self.system_prompt is not None:
            return self.system_prompt
        text = DEFAULT_SYSTEM_PROMPT.format(think=THINK_INSTRUCTION if self.reasoning else "")
        text = f"{text} {COPY_REFS_INSTRUCTION}" if self.copy_refs else text
        text = f"{text} {ELEMENT_REFS_INSTRUCTION}" if self.copy_refs and self.element_refs else text
        text = f"{text} {EXACT_NEIGHBOURS_INSTRUCTION}" if self.exact_neighbours else text
        text = f"{text} {TASK_NEIGHBOURS_INSTRUCTION}" if self.task_neighbours else text
        text = f"{text} {NEIGHBOUR_CHANGES_INSTRUCTION}" if self.neighbour_changes else text
        return f"{text} {SAME_ACTION_INSTRUCTION}" if self.same_action_neighbours else text


# ------------------------------------------------------------------------------------------ prompt


def truncate_lines(text: str, max_chars: int | None) -> str:
    """Cut ``text`` to at most ``max_chars`` characters, keeping whole lines and ending with a ``…`` line.

    If not even the first line fits, that line itself is cut and ends with ``…``.
    """
    text = text.strip()
    if max_chars is None or len(text) <= max_chars:
        return text
    kept: list[str] = []
    used = len(TRUNCATION_MARK)
    for line in text.split("\n"):
        if used + len(line) + 1 > max_chars:
            break
        kept.append(line)
        used += len(line) + 1
    if not kept:
        return text[: max_chars - len(TRUNCATION_MARK)] + TRUNCATION_MARK
    return "\n".join([*kept, TRUNCATION_MARK])


def _history_lines(query: ExperienceQuery, cfg: ProtocolConfig) -> list[str]:
    if cfg.history_window == 0 or not query.history:
        return []
    start = max(0, len(query.history) - cfg.history_window)
    lines = ["HISTORY:"]
    for i, (state, action) in enumerate(query.history[start:], start=start + 1):
        if cfg.history_states:
            lines += [f"#{i}", truncate_lines(state, cfg.max_state_chars), f"→ {action}"]
        else:
            lines.append(f"#{i} {action}")
    return lines


SAME_STEP = "same task, state and action"  # the header of an exact neighbour (ProtocolConfig.exact_neighbours)
SAME_ACTION = "same action"  # the header of another neighbour that took the query's action (same_action_neighbours)
SAME_TASK_ACTION = "same task and action"  # ... recorded in the query's task (task_neighbours)


def added_lines(state: str, next_state: str) -> str:
    """The lines of ``next_state`` that ``state`` does not show (``ProtocolConfig.neighbour_changes``): an element
    whose type and text the state lists, under any id, is not new (TextWorld's ids are positions, which a new
    element renumbers); any other line is new unless the state has it."""
    def seen(line: str) -> tuple[str, str] | str:
        element = Element.parse(line)
        return (element.type, element.text) if element is not None else line.strip()

    shown = {seen(line) for line in state.splitlines()}
    return "\n".join(line for line in next_state.strip().splitlines() if seen(line) not in shown)


def neighbour_page(n: Neighbour, cfg: ProtocolConfig) -> str:
    """Neighbour ``n``'s next state as the prompt shows it (and copy references read it): whole, or its
    :func:`added_lines` with ``cfg.neighbour_changes``; cut to ``cfg.max_neighbour_chars``."""
    return truncate_lines(added_lines(n.state, n.next_state) if cfg.neighbour_changes else n.next_state,
                          cfg.max_neighbour_chars)


def _similar_lines(query: ExperienceQuery, cfg: ProtocolConfig) -> list[str]:
    shown = query.retrieved[: cfg.k]
    if not shown:
        return []
    lines = ["SIMILAR:"]
    for i, n in enumerate(shown, start=1):
        same = cfg.exact_neighbours and (n.instruction, n.state, n.action) == (query.instruction, query.state,
                                                                              query.action)
        task = cfg.task_neighbours and is_task_neighbour(query, n)
        header = SAME_STEP if same else SAME_TASK_ACTION if task else SAME_ACTION if (
            cfg.same_action_neighbours and n.action == query.action) else ""
        lines.append(f"({i}) {header}" if header else f"({i})")
        if cfg.neighbour_states:
            lines.append(truncate_lines(n.state, cfg.max_neighbour_chars))
        lines += [
            f"→ {n.action}",
            "⇒ new lines:" if cfg.neighbour_changes else "⇒",
            neighbour_page(n, cfg),
            f"| r={n.reward:.2f} d={int(n.done)}",
        ]
    return lines


_ACTION_ARG = re.compile(r"^\s*\w+\s*\[(.+)\]\s*$", re.S)


def action_target(state: str, action: str) -> str | None:
    """The line of ``state`` that the action ``verb[arg]`` names, or None.

    Actions name elements loosely (WebShop lower-cases them: ``click[b0dgqt29]`` for the link
    ``[7] link: B0DGQT29 — Nolove Velvet Sofa | $289.47``; ``click[brown]`` for ``option: color=brown``). An
    element matches when ``arg`` equals, ignoring case, its label, the label's head before `` — `` or `` | ``, or
    the value after ``=``. Showing that line next to the action (``TARGET:``) is part of the abstract state: it
    puts what the next state must copy right before the output, in its original case, so a small model copies
    from a fixed nearby place instead of searching the page by a lower-cased key (which a from-scratch model
    learns slowly: the README's experience-model ablations). Env-agnostic: an action without brackets, or naming no element, has none.
    """
    match = _ACTION_ARG.match(action)
    if match is None:
        return None
    arg = " ".join(match.group(1).split()).lower()
    for line in state.splitlines():
        element = Element.parse(line)
        if element is None:
            continue
        label = element.text.removesuffix(" (selected)").strip()
        keys = {label, re.split(r" — | \| ", label, maxsplit=1)[0]}
        if "=" in label:
            keys.add(label.split("=", 1)[1])
        if arg in {" ".join(k.split()).lower() for k in keys}:
            return line.strip()
    return None


def build_user_text(query: ExperienceQuery, cfg: ProtocolConfig) -> str:
    """The user message: TASK, HISTORY, SIMILAR, STATE, ACTION [, TARGET] (deterministic; empty sections left
    out); with ``task_last`` the TASK line comes after the others."""
    task = f"TASK: {query.instruction.strip()}"
    lines = [] if cfg.task_last else [task]
    lines += _history_lines(query, cfg)
    lines += _similar_lines(query, cfg)
    lines += ["STATE:", truncate_lines(query.state, cfg.max_state_chars), f"ACTION: {query.action.strip()}"]
    target = action_target(query.state, query.action) if cfg.ground_action else None
    if target is not None:
        lines.append(f"TARGET: {target}")
    return "\n".join([*lines, task] if cfg.task_last else lines)


def build_messages(query: ExperienceQuery, cfg: ProtocolConfig) -> list[dict[str, str]]:
    """Chat messages (system + user) for instruct models; the target is the assistant reply."""
    system = cfg.system_text()
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": build_user_text(query, cfg)})
    return messages


def build_prompt_text(query: ExperienceQuery, cfg: ProtocolConfig) -> str:
    """The same content as one string for raw-prompt backends: ``prompt_text + target`` is the SFT text."""
    system = cfg.system_text()
    user = build_user_text(query, cfg)
    return f"{system}\n\n{user}\n" if system else f"{user}\n"


MIN_STATE_CHARS = 100  # the state is cut no shorter than this when a prompt is fitted to a token budget
MIN_NEIGHBOUR_CHARS = 120  # nor the last neighbour's page (ProtocolConfig.cut_neighbour_page): about one feedback line


def _halvings(chars: int, floor: int) -> Iterator[int]:
    """``chars`` halved again and again while it stays above ``floor`` (the last value may be below it)."""
    while chars > floor:
        chars //= 2
        yield chars


def is_task_neighbour(query: ExperienceQuery, n: Neighbour) -> bool:
    """Whether ``n`` was recorded in the query's task and took its action (``task_neighbours``' header)."""
    return (n.instruction, n.action) == (query.instruction, query.action)


def shorter_layouts(query: ExperienceQuery, cfg: ProtocolConfig) -> Iterator[ProtocolConfig]:
    """Ever shorter prompt layouts for ``query``, for a prompt over its token budget: the neighbours dropped one at
    a time (the least similar first), then the history one step at a time (the oldest first; the steps left keep
    their numbers), or the history first with ``cfg.cut_history_first``, then the state cut to fewer whole lines
    (its character limit halved, down to :data:`MIN_STATE_CHARS`). The system text and the TASK, ACTION and TARGET
    lines are never cut. With ``cfg.cut_neighbour_page`` the last neighbour's page is first cut to fewer whole lines
    (halved, down to :data:`MIN_NEIGHBOUR_CHARS`), then dropped."""
    n = min(cfg.k, len(query.retrieved))
    last_page = [] if not cfg.cut_neighbour_page or n == 0 else [
        {"k": 1, "max_neighbour_chars": c} for c in _halvings(len(neighbour_page(query.retrieved[0], cfg)),
                                                              MIN_NEIGHBOUR_CHARS) if c >= MIN_NEIGHBOUR_CHARS]
    neighbours = [{"k": k} for k in range(n - 1, 0, -1)] + last_page + ([{"k": 0}] if n else [])
    history = [{"history_window": w} for w in range(min(cfg.history_window, len(query.history)) - 1, -1, -1)]
    if cfg.cut_history_first:
        steps = history + [{"history_window": 0, **k} for k in neighbours]
    else:
        steps = neighbours + [{"k": 0, **w} for w in history]
    for update in steps:
        yield cfg.model_copy(update=update)
    state_chars = min(cfg.max_state_chars or len(query.state), len(query.state.strip()))
    for chars in _halvings(state_chars, MIN_STATE_CHARS):
        yield cfg.model_copy(update={"k": 0, "history_window": 0, "max_state_chars": chars})


def prompt_layouts(query: ExperienceQuery, cfg: ProtocolConfig) -> Iterator[ProtocolConfig]:
    """``cfg`` itself, then :func:`shorter_layouts`: every layout a prompt for ``query`` may be served in, in order."""
    yield cfg
    yield from shorter_layouts(query, cfg)


def fit_layout(
    query: ExperienceQuery, cfg: ProtocolConfig, chat: bool, count_tokens: Callable[[Any], int], budget: int
) -> tuple[ProtocolConfig, str | list[dict[str, str]]] | None:
    """The first of :func:`prompt_layouts` whose prompt for ``query`` (chat messages or plain text) is within
    ``budget`` tokens, and that prompt; None when not even the shortest fits.

    The one truncation rule of M_exp prompts: SFT (``budget`` = ``max_length`` minus the target's tokens, or
    ``ExperienceConfig.prompt_budget``) and inference (the same budget) both go through it, so a model is trained
    on the shortened prompts it is later served. The layout says what a copy reference may point at
    (:func:`ref_context`, with ``cfg.layout_refs``).
    """
    for layout in prompt_layouts(query, cfg):
        prompt = build_messages(query, layout) if chat else build_prompt_text(query, layout)
        if count_tokens(prompt) <= budget:
            return layout, prompt
    return None


def fit_prompt(
    query: ExperienceQuery, cfg: ProtocolConfig, chat: bool, count_tokens: Callable[[Any], int], budget: int
) -> tuple[str | list[dict[str, str]] | None, bool]:
    """:func:`fit_layout`'s prompt (None when none fits) and whether it had to be shortened."""
    fitted = fit_layout(query, cfg, chat, count_tokens, budget)
    return (None, True) if fitted is None else (fitted[1], fitted[0] is not cfg)


# ------------------------------------------------------------------------------------------ target


def _check_free_of_tags(name: str, text: str) -> None:
    tag = _TAG.search(text)
    stop = next((s for s in STOP_TEXTS if s in text), None)
    if tag is not None or stop is not None:
        found = tag.group(0) if tag is not None else stop
        raise ValueError(f"{name} contains the protocol text {found!r}; the target would not parse")


def format_target_parts(
    next_state: str, reward: float, done: bool, success: bool, reasoning: str | None, cfg: ProtocolConfig
) -> list[tuple[str, str]]:
    """The target as named consecutive pieces: reasoning (if cfg.reasoning), state, reward, done, success.

    Raises ValueError for a reward outside [0, 1], success without done, an empty state, or a protocol tag or
    stop-token text inside the state or reasoning (such a target could not be parsed back).
    """
    state = next_state.strip()
    if not state:
        raise ValueError("next_state is empty")
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
        raise ValueError(f"reward must be in [0, 1], got {reward!r}")
    if success and not done:
        raise ValueError("success=True on a step with done=False")
    _check_free_of_tags("next_state", state)
    parts: list[tuple[str, str]] = []
    if cfg.reasoning:
        if reasoning is None:
            raise ValueError("cfg.reasoning is True but no reasoning was given")
        _check_free_of_tags("reasoning", reasoning)
        parts.append(("reasoning", f"<think>{reasoning.strip()}</think>\n"))
    parts += [
        ("state", f"<state>\n{state}\n</state>\n"),
        ("reward", f"<reward>{reward + 0.0:.2f}</reward>"),
        ("done", f" <done>{int(done)}</done>"),
        ("success", f" <success>{int(success)}</success>"),
    ]
    return parts


def format_target(
    next_state: str, reward: float, done: bool, success: bool, reasoning: str | None, cfg: ProtocolConfig
) -> str:
    """The text M_exp is trained to write (see the module docstring); ``reasoning`` is ignored without cfg.reasoning."""
    return "".join(text for _, text in format_target_parts(next_state, reward, done, success, reasoning, cfg))


def terminated(t: Transition) -> bool:
    """Whether the environment itself ended the episode at this step.

    A step cut by ``max_steps`` (``info["truncated"]``, see ``dreamgym.collect``) is recorded with done=True but
    is not an ending M_exp should learn: the dream env truncates on its own step limit.
    """
    return t.done and not t.info.get("truncated", False)


def ref_context(query: ExperienceQuery, cfg: ProtocolConfig) -> RefContext:
    """What a copy reference of ``query``'s target may point at: the STATE, TARGET and neighbour next states as
    the prompt in layout ``cfg`` shows them (cut as :func:`build_user_text` cuts them)."""
    target = action_target(query.state, query.action) if cfg.ground_action else None
    neighbours = tuple(neighbour_page(n, cfg) for n in query.retrieved[: cfg.k])
    return RefContext.of(truncate_lines(query.state, cfg.max_state_chars), target, neighbours, cfg.element_refs)


def _refs_target(next_state: str, reward: float, done: bool, success: bool, reasoning: str | None,
                 cfg: ProtocolConfig, query: ExperienceQuery) -> str:
    """:func:`format_target` with the next state and reasoning pointing at the text of ``query``'s prompt in
    layout ``cfg`` (copy references)."""
    ctx = ref_context(query, cfg)
    reasoning = None if reasoning is None else encode_inline(reasoning.strip(), ctx)
    return format_target(encode_refs(next_state.strip(), ctx), reward, done, success, reasoning, cfg)


def premise_text(premise: str, query: ExperienceQuery, cfg: ProtocolConfig) -> str:
    """The opening of a target whose trace starts with ``premise`` (``computed_premises``), written as the target
    writes it: the think tag, then the premise (pointing into ``query``'s prompt in layout ``cfg`` with copy
    references)."""
    return "<think>" + (encode_inline(premise.strip(), ref_context(query, cfg)) if cfg.copy_refs else premise.strip())


def step_target(traj: Trajectory, t: int, reasoning: str | None, cfg: ProtocolConfig,
                query: ExperienceQuery | None = None) -> str:
    """The target for step ``t`` of a recorded trajectory: done is :func:`terminated`; success is the
    episode's, on its final step only. With ``cfg.copy_refs`` the next state and reasoning point at the text of
    ``query`` (the prompt the target answers; required then)."""
    x = traj.transitions[t]
    done = terminated(x)
    success = traj.success and done and t == len(traj.transitions) - 1
    if cfg.copy_refs:
        if query is None:
            raise ValueError("copy_refs targets point into the prompt: pass the step's query")
        return _refs_target(x.next_state, x.reward, done, success, reasoning, cfg, query)
    return format_target(x.next_state, x.reward, done, success, reasoning, cfg)


def same_refs(a: ProtocolConfig, b: ProtocolConfig) -> bool:
    """Whether copy references mean the same in layouts ``a`` and ``b`` of one query (:func:`ref_context`'s inputs)."""
    return (a.k, a.max_state_chars, a.max_neighbour_chars, a.ground_action) == (
        b.k, b.max_state_chars, b.max_neighbour_chars, b.ground_action)


def retarget(target: str, query: ExperienceQuery, cfg: ProtocolConfig, layout: ProtocolConfig) -> str | None:
    """``target``, written against ``query``'s prompt in layout ``cfg``, with its copy references pointing into
    the shorter ``layout`` instead (:func:`shorter_layouts`): a line of a dropped neighbour or of a cut-off state
    line is written out. Unchanged without ``cfg.copy_refs`` or ``cfg.layout_refs``, or where the references
    mean the same in both; None if ``target`` does not parse against ``cfg`` (a caller bug)."""
    if not (cfg.copy_refs and cfg.layout_refs) or same_refs(cfg, layout):
        return target
    parsed = parse_output(target, cfg, query=query)
    p = parsed.prediction
    if p is None:
        return None
    return _refs_target(p.next_state, p.reward, p.done, p.success, p.reasoning, layout, query)


def target_spans(
    next_state: str, reward: float, done: bool, success: bool, reasoning: str | None, cfg: ProtocolConfig
) -> dict[str, tuple[int, int]]:
    """Character ``[start, end)`` of each piece of :func:`format_target`'s text (for per-part losses/metrics)."""
    spans: dict[str, tuple[int, int]] = {}
    pos = 0
    for name, text in format_target_parts(next_state, reward, done, success, reasoning, cfg):
        spans[name] = (pos, pos + len(text))
        pos += len(text)
    return spans


# ------------------------------------------------------------------------------------------ parser


@dataclass(frozen=True)
class ParseResult:
    """Either a ``prediction`` or a failure ``reason`` (one of :data:`FAILURE_REASONS`)."""

    prediction: ExperiencePrediction | None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.prediction is not None


_TAG = re.compile(r"<\s*(/?)\s*(think|state|reward|done|success)\s*>", re.IGNORECASE)
_CLOSE_THINK = re.compile(r"<\s*/\s*think\s*>", re.IGNORECASE)
_PARTIAL_TAG = re.compile(r"<\s*/?\s*[a-z]*\s*$", re.IGNORECASE)
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # ASCII digits only
_BOOLS = {"0": False, "1": True, "false": False, "true": True}


class _Fail(Exception):
    """Internal: carries a failure reason out of the block scanner."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _cut_at_stop(text: str) -> str:
    cut = len(text)
    for stop in STOP_TEXTS:
        i = text.find(stop, 0, cut)
        if i >= 0:
            cut = i
    return text[:cut]


def _missing(name: str, rest: str, length_limited: bool) -> _Fail:
    """A block is absent: the output was cut short (a half tag at the end, or the token limit) or it is missing."""
    if length_limited or _PARTIAL_TAG.search(rest.rstrip()):
        return _Fail("truncated")
    return _Fail(f"missing_{name}")


def _read_block(text: str, pos: int, name: str, consumed: set[str], length_limited: bool) -> tuple[str, int]:
    """Read ``<name>content</name>`` starting at the next tag after ``pos``; return (content, end)."""
    opening = _TAG.search(text, pos)
    if opening is None:
        raise _missing(name, text[pos:], length_limited)
    is_close, tag = opening.group(1) == "/", opening.group(2).lower()
    if is_close or tag != name:
        raise _Fail(f"duplicate_{tag}" if not is_close and tag in consumed else f"missing_{name}")
    closing = _TAG.search(text, opening.end())
    if closing is None:
        raise _Fail("truncated")
    if closing.group(1) != "/" or closing.group(2).lower() != name:
        raise _Fail(f"unclosed_{name}")
    consumed.add(name)
    return text[opening.end() : closing.start()], closing.end()


def _parse_bool(raw: str, name: str) -> bool:
    value = _BOOLS.get(raw.strip().lower())
    if value is None:
        raise _Fail(f"bad_{name}")
    return value


def _parse_reward(raw: str) -> float:
    raw = raw.strip()
    if not _NUMBER.fullmatch(raw):
        raise _Fail("bad_reward")
    value = float(raw)
    if not math.isfinite(value):
        raise _Fail("bad_reward")
    if not 0.0 <= value <= 1.0:
        raise _Fail("reward_out_of_range")
    return value + 0.0  # -0.0 -> 0.0


def _parse(text: str, cfg: ProtocolConfig, length_limited: bool) -> ExperiencePrediction:
    text = _cut_at_stop(text)
    if not text.strip():
        raise _Fail("truncated" if length_limited else "empty")
    pos, reasoning, consumed = 0, None, set[str]()
    first = _TAG.search(text)
    if first is not None and first.group(1) != "/" and first.group(2).lower() == "think":
        closing = _CLOSE_THINK.search(text, first.end())
        if closing is None:
            raise _Fail("truncated")
        reasoning, pos = text[first.end() : closing.start()].strip(), closing.end()
        consumed.add("think")
    elif cfg.reasoning:
        raise _missing("think", text, length_limited) if first is None else _Fail("missing_think")
    state, pos = _read_block(text, pos, "state", consumed, length_limited)
    reward_raw, pos = _read_block(text, pos, "reward", consumed, length_limited)
    done_raw, pos = _read_block(text, pos, "done", consumed, length_limited)
    success_raw, pos = _read_block(text, pos, "success", consumed, length_limited)
    state = state.strip()
    if not state:
        raise _Fail("empty_state")
    reward = _parse_reward(reward_raw)
    done = _parse_bool(done_raw, "done")
    success = _parse_bool(success_raw, "success")
    if success and not done:
        raise _Fail("success_not_done")
    return ExperiencePrediction(reasoning, state, reward, done, success)


def _expand(pred: ExperiencePrediction, query: ExperienceQuery | None, cfg: ProtocolConfig) -> ExperiencePrediction:
    if query is None:
        raise _Fail("bad_ref")  # nothing to point into (a caller bug; counted, never raised)
    ctx = ref_context(query, cfg)
    state = expand_refs(pred.next_state, ctx)
    reasoning = None if pred.reasoning is None else expand_inline(pred.reasoning, ctx)
    if state is None or not state.strip() or (pred.reasoning is not None and reasoning is None):
        raise _Fail("bad_ref")
    return replace(pred, next_state=state, reasoning=reasoning)


def parse_output(text: str, cfg: ProtocolConfig, length_limited: bool = False,
                 query: ExperienceQuery | None = None) -> ParseResult:
    """Parse M_exp's output (grammar in the module docstring). Never raises.

    Pass ``length_limited=True`` when the backend stopped at its token limit, so that an incomplete output is
    counted as ``"truncated"`` rather than as a missing block. With ``cfg.copy_refs`` the references are written
    out against ``query`` (the prompt's query); one that points at nothing fails as ``"bad_ref"``.
    """
    try:
        pred = _parse(str(text), cfg, length_limited)
        return ParseResult(_expand(pred, query, cfg) if cfg.copy_refs else pred)
    except _Fail as f:
        return ParseResult(None, f.reason)
    except Exception as e:  # defensive: the contract is "never raises"; a bug here must not stop a rollout
        log.exception("experience-output parser failed unexpectedly")
        return ParseResult(None, f"parser_error:{type(e).__name__}")


# ------------------------------------------------------------------------------------------ fallback


def failure_prediction(state: str, reason: str) -> ExperiencePrediction:
    """The paper's "invalid output yields a failure state with reward 0".

    The state stays exactly as it was (no error line is added), reward 0, not done: this is what the real
    environments do for an invalid action (see ``dreamgym.envs.base``), so the policy sees the same signal in
    the dream and in the real env, and the episode can continue (``max_steps`` still truncates it).
    """
    return ExperiencePrediction(
        reasoning=None, next_state=state, reward=0.0, done=False, success=False, failure=reason
    )


@dataclass
class ParseStats:
    """Counts of parsed outputs and of each failure reason (the "counted fallback")."""

    ok: int = 0
    failures: Counter[str] = field(default_factory=Counter)

    def add(self, result: ParseResult) -> None:
        if result.ok:
            self.ok += 1
        else:
            self.failures[result.reason or "unknown"] += 1

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    @property
    def total(self) -> int:
        return self.ok + self.failed

    @property
    def invalid_rate(self) -> float:
        return self.failed / self.total if self.total else 0.0

    def merge(self, other: ParseStats) -> None:
        self.ok += other.ok
        self.failures.update(other.failures)

    def as_dict(self) -> dict[str, int | float | dict[str, int]]:
        return {
            "ok": self.ok,
            "failed": self.failed,
            "invalid_rate": self.invalid_rate,
            "failures": dict(sorted(self.failures.items())),
        }


def parse_or_fallback(
    text: str, state: str, cfg: ProtocolConfig, stats: ParseStats | None = None, length_limited: bool = False,
    query: ExperienceQuery | None = None,
) -> ExperiencePrediction:
    """Parse an output; on failure return :func:`failure_prediction` for ``state``. Counts into ``stats``."""
    result = parse_output(text, cfg, length_limited, query)
    if stats is not None:
        stats.add(result)
    if result.prediction is not None:
        return result.prediction
    reason = result.reason or "unknown"
    log.debug("invalid experience-model output (%s): %.200r", reason, text)
    return failure_prediction(state, reason)
