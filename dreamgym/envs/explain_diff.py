"""Rule explainers for text envs whose abstract states are ``[id] type: text`` lines under a ``key: value``
header (TextWorld, ScienceWorld): the state diff of a step, the replay that reads the env's score, the trace.
:func:`explain_state_diff` is the same trace for any env, from its states alone (the ``diff`` annotator).

A trace says, from ground truth, what the action did to the abstract state, in one short line::

    "take red apple" listed: valid; location Kitchen; carrying +a red apple; command +eat red apple -take red apple; score 0.33 -> 0.67; reward 0
    "go east" listed: valid; location Kitchen -> Pantry; new room: 6 command; score 0.33; reward 0
    "eat meal" listed: valid; ...; score 0.67 -> 1.00; done, reward 1.00
    "fly" not listed: invalid -> state unchanged, reward 0

The diff comes from the recorded states (the real env's output); the score from replaying the recorded actions
in the env rebuilt from ``meta["env_kwargs"]``, which must reproduce every recorded next state. From the first
mismatch on the trace has no score, and the explanation counts ``replay_mismatch`` (logged), so a trace is
never silently wrong. A room change lists only the counts of the room's elements (the whole new room would
not be a compact trace); ``max_items`` caps the elements quoted per type.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from dreamgym.envs.base import Element, TextEnv, make, parse_elements, truncate
from dreamgym.types import DataError, Explanation, Trajectory, Transition

log = logging.getLogger(__name__)

INVALID_OUTCOME = "-> state unchanged, reward 0"
MAX_QUOTED = 40  # characters of one quoted element or action


@dataclass(frozen=True)
class ParsedState:
    """An abstract state: its header (``location: kitchen`` -> ``("location", "kitchen")``) and its element
    texts by type, in order."""

    header: tuple[str, str]
    elements: dict[str, list[str]]

    @classmethod
    def parse(cls, state: str) -> ParsedState:
        lines = state.splitlines()
        header = ("", "")
        if lines and not lines[0].startswith("["):
            key, _, value = lines[0].partition(": ")
            header = (key.strip(), value.strip())
        elements: dict[str, list[str]] = {}
        for element in map(Element.parse, lines):
            if element is not None:
                elements.setdefault(element.type, []).append(element.text)
        return cls(header, elements)


def _short(text: str, limit: int = MAX_QUOTED) -> str:
    return truncate(" ".join(text.split()), limit)


def element_diff(before: Sequence[str], after: Sequence[str], max_items: int = 3) -> str:
    """``+added… -removed…`` (a multiset difference), at most ``max_items`` quoted per side; "" if equal."""
    added, removed = Counter(after) - Counter(before), Counter(before) - Counter(after)
    parts = []
    for sign, changed in (("+", list(added.elements())), ("-", list(removed.elements()))):
        parts += [f"{sign}{_short(t)}" for t in changed[:max_items]]
        if len(changed) > max_items:
            parts.append(f"({sign}{len(changed) - max_items} more)")
    return " ".join(parts)


def state_diff(before: str, after: str, types: Sequence[str], room_types: frozenset[str], max_items: int = 3) -> list[str]:
    """The header (``location A -> B``) and, per element type, what the step added and removed; after a room
    change the ``room_types`` elements (the room's contents) are only counted."""
    s0, s1 = ParsedState.parse(before), ParsedState.parse(after)
    moved = s0.header != s1.header
    key = s1.header[0] or "header"
    segments = [f"{key} {s0.header[1]} -> {s1.header[1]}" if moved else f"{key} {s1.header[1]}"]
    if not (s0.header[0] or s1.header[0]):  # states without a header line (any env's, see explain_state_diff)
        segments = []
    if moved:
        counts = [f"{len(s1.elements.get(kind, []))} {kind}" for kind in types if kind in room_types]
        segments.append("new room: " + ", ".join(counts))
    for kind in types:
        if moved and kind in room_types:
            continue
        if diff := element_diff(s0.elements.get(kind, []), s1.elements.get(kind, []), max_items):
            segments.append(f"{kind} {diff}")
    return segments


@functools.lru_cache(maxsize=2)
def _env(name: str, kwargs_json: str) -> TextEnv:
    """One env per (name, kwargs), kept for the next trajectories (a ScienceWorld JVM closes at exit)."""
    return make(name, **json.loads(kwargs_json))


def replay_scores(traj: Trajectory) -> list[float]:
    """The env's ``info["score"]`` before the first step and after each step whose replayed observation equals
    the recorded next state (so fewer than ``steps + 1`` scores mark a mismatch)."""
    kwargs = traj.meta.get("env_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise DataError(f"trajectory {traj.traj_id}: meta.env_kwargs must be an object, got {kwargs!r}")
    name = str(traj.meta.get("env") or traj.task.env)
    try:
        env = _env(name, json.dumps(kwargs, sort_keys=True))
    except (TypeError, ValueError) as e:
        raise DataError(f"trajectory {traj.traj_id}: cannot rebuild env {name!r} from {kwargs}: {e}") from None
    seed = traj.meta.get("seed")
    try:
        obs, info = env.reset(seed=seed if isinstance(seed, int) else None,
                              options={"task": traj.task, "split": str(traj.meta.get("split", "train"))})
    except (KeyError, ValueError) as e:
        raise DataError(f"trajectory {traj.traj_id}: cannot replay task {traj.task.task_id!r}: {e}") from None
    if not traj.transitions or obs != traj.transitions[0].state:
        return []
    scores = [float(info.get("score", 0.0))]
    for x in traj.transitions:
        obs, reward, _, _, info = env.step(x.action)
        if obs != x.next_state or abs(reward - x.reward) > 1e-6:
            break
        scores.append(float(info.get("score", 0.0)))
    return scores


def listed_head(action: str, listed: bool) -> str:
    """A trace's head: the action, quoted (shortened), and whether the game listed it."""
    return f'"{_short(action)}" {"listed" if listed else "not listed"}'


def step_trace(x: Transition, types: Sequence[str], room_types: frozenset[str],
               score: tuple[float, float] | None, max_items: int = 3) -> str:
    """The trace of one recorded step (see the module docstring); ``score``: before and after, when known."""
    head = listed_head(x.action, x.action in set(x.info.get("admissible_actions") or []))
    if x.info.get("invalid_action"):
        return f"{head}: invalid {INVALID_OUTCOME}"
    segments = [f"{head}: valid", *state_diff(x.state, x.next_state, types, room_types, max_items)]
    if score is not None:
        before, after = score
        segments.append(f"score {before:.2f} -> {after:.2f}" if after != before else f"score {after:.2f}")
    segments.append(f"done, reward {x.reward:.2f}" if x.done else f"reward {x.reward:g}")
    return "; ".join(segments)


def explain_text_trajectory(traj: Trajectory, types: Sequence[str], room_types: frozenset[str],
                            max_items: int = 3) -> Explanation:
    """One trace per transition; counts ``replay_mismatch`` and ``unscored_steps`` (traces without a score)."""
    issues: Counter[str] = Counter()
    try:
        scores = replay_scores(traj)
    except DataError as e:  # counted and logged: the traces are written without scores
        log.warning("%s", e)
        issues["replay_failed"] += 1
        scores = []
    if len(scores) < len(traj.transitions) + 1:
        issues["replay_mismatch"] += 1
        issues["unscored_steps"] += len(traj.transitions) + 1 - max(len(scores), 1)
        log.warning("trajectory %s: the %s replay differs from the record after %d steps",
                    traj.traj_id, traj.task.env, max(len(scores) - 1, 0))
    traces = []
    for t, x in enumerate(traj.transitions):
        score = (scores[t], scores[t + 1]) if t + 1 < len(scores) else None
        traces.append(step_trace(x, types, room_types, score, max_items))
    return Explanation(traces, None, issues)


def explain_state_diff(traj: Trajectory, max_items: int = 3) -> Explanation:
    """Any env's traces, from the recorded states alone: the element types each step added or removed (every
    type the states show), the reward and the ending. No replay, so no score: the fallback for an env that
    registers no explainer."""
    traces = []
    for x in traj.transitions:
        types = list(dict.fromkeys(e.type for state in (x.state, x.next_state) for e in parse_elements(state)))
        traces.append(step_trace(x, types, frozenset(), None, max_items))
    return Explanation(traces, None, Counter())
