"""TextWorld's rule-based annotator: one trace per real transition, from the recorded states and a replay of
the game's score (see :mod:`dreamgym.envs.explain_diff`)::

    "open fridge" listed: valid; location Kitchen; command +close fridge +take milk from fridge -open fridge; score 0.00; reward 0

With ``recipe=True`` (``DemoConfig.annotator_options``) a ``take`` and a ``prepare meal`` also say what the recipe
asks, read from the task's instruction and the carried items, so that the experience model writes the comparison
before the page it decides (a meal is made only when every ingredient is carried; taking an ingredient scores)::

    "take red potato from counter" listed: valid; recipe: purple potato, red bell pepper; red potato not needed; ...
    "prepare meal" listed: valid; recipe: purple potato, red bell pepper; carried: purple potato; missing red bell pepper; ...

Everything before the last ``...`` is read from the step's query alone (the task, the state, the action), so
:func:`trace_premise` writes it at inference too: with ``ProtocolConfig.computed_premises`` the experience model is
handed that start of its trace and writes the rest (what changes, the page), as a program-aided model hands its
arithmetic to an interpreter. The 1.3M-parameter M_exp copies the recipe but does not compute which ingredient is
missing (journal, "What the TextWorld dreams paid for").
"""

from __future__ import annotations

import re

from dreamgym.envs.explain_diff import ParsedState, explain_text_trajectory, listed_head
from dreamgym.envs.textworld.policies import PREPARE
from dreamgym.types import Explanation, Trajectory, Transition

ELEMENT_TYPES = ("carrying", "command")  # the feedback is new text: the model writes it, the trace does not
ROOM_TYPES = frozenset({"command"})  # what a room change replaces (the inventory travels along)
_TAKE = re.compile(r"^take (.+?)(?: from .+)?$")


def explain_trajectory(traj: Trajectory, recipe: bool = False) -> Explanation:
    explanation = explain_text_trajectory(traj, ELEMENT_TYPES, ROOM_TYPES)
    if not recipe:
        return explanation
    needed = recipe_ingredients(traj.task.instruction)
    if not needed:  # counted: the traces stay as they were
        explanation.issues["no_recipe"] += 1
        return explanation
    traces = [recipe_trace(trace, x, needed) for trace, x in zip(explanation.reasoning, traj.transitions, strict=True)]
    return Explanation(traces, explanation.task_tutorial, explanation.issues)


def recipe_ingredients(instruction: str) -> list[str]:
    """The ingredients' names in a task's ``(ingredients: a (fried), b, …)``, without how each is prepared."""
    _, found, rest = instruction.rpartition("(ingredients: ")
    if not found:
        return []
    names, depth, word = [], 0, ""
    for ch in rest:
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            names.append(word)
            word = ""
        elif depth == 0:
            word += ch
    names.append(word)
    return [n.strip() for n in names if n.strip()]


def names_item(text: str, name: str) -> bool:
    """Whether ``text`` is ``name`` or ``... name`` (e.g. ``a diced red potato`` names ``red potato``)."""
    return text == name or text.endswith(" " + name)


def taken_item(action: str) -> str | None:
    """What a ``take X`` or ``take X from Y`` command takes (X); None for other commands."""
    return take.group(1) if (take := _TAKE.match(action)) is not None else None


def carries(state: str, name: str) -> bool:
    """Whether ``state`` lists ``name`` (see :func:`names_item`) as carried."""
    return any(names_item(t, name) for t in ParsedState.parse(state).elements.get("carrying", []))


def meals(page: str) -> int:
    """How many meals ``page`` lists as carried."""
    return sum(names_item(t, "meal") for t in ParsedState.parse(page).elements.get("carrying", []))


def meal_outcome(state: str, action: str, next_state: str, needed: list[str]) -> tuple[bool, bool] | None:
    """For a ``prepare meal`` step: (every ingredient in ``needed`` was carried in ``state``, ``next_state`` carries a
    meal ``state`` did not). The real game makes a meal exactly when the first holds ("You still miss something."
    otherwise), so a made meal that lacked an ingredient is a page the game never writes. None for other actions."""
    if action != PREPARE:
        return None
    return all(carries(state, n) for n in needed), meals(next_state) > meals(state)


def revealed_ingredients(state: str, action: str, next_state: str, needed: list[str]) -> list[str] | None:
    """For an ``open X`` step: the ingredients in ``needed`` that ``next_state`` newly offers to take from X (what
    the container held, which no earlier page shows: the real game's fridge holds the recipe's ingredients in most
    games). None for other actions."""
    if not action.startswith("open "):
        return None
    source = action.removeprefix("open ")
    before = set(ParsedState.parse(state).elements.get("command", []))
    after = set(ParsedState.parse(next_state).elements.get("command", [])) - before
    return [n for n in needed if f"take {n} from {source}" in after]


def recipe_segment(state: str, action: str, needed: list[str]) -> str | None:
    """What the recipe says of a ``take`` or ``prepare meal`` from ``state`` (None for other actions)."""
    segment = f"recipe: {', '.join(needed)}"
    if action == PREPARE:
        have = [n for n in needed if carries(state, n)]
        missing = [n for n in needed if n not in have]
        return segment + f"; carried: {', '.join(have) or 'none'}; " + (f"missing {', '.join(missing)}" if missing
                                                                         else "none missing")
    if (item := taken_item(action)) is not None:
        return segment + f"; {item} {'needed' if item in needed else 'not needed'}"
    return None


def recipe_trace(trace: str, x: Transition, needed: list[str]) -> str:
    """``trace`` with the recipe's segment after its head, for a valid ``take`` or ``prepare meal``."""
    head, sep, rest = trace.partition("; ")
    segment = recipe_segment(x.state, x.action, needed)
    if not sep or not head.endswith(": valid") or segment is None:
        return trace
    return f"{head}; {segment}; {rest}"


def trace_premise(instruction: str, state: str, action: str) -> str | None:
    """The start of the recipe trace (``annotator_options: {recipe: true}``) of a ``take`` or ``prepare meal`` that
    ``state`` offers, from the query alone: its head and the recipe's segment, up to the ``;`` after which the
    annotator writes what the step changes. None for other actions, for one the page does not offer (the annotator
    reads the game's full admissible list, which the page may cut), and for a task without a recipe."""
    needed = recipe_ingredients(instruction)
    segment = recipe_segment(state, action, needed) if needed else None
    if segment is None or action not in ParsedState.parse(state).elements.get("command", []):
        return None
    return f"{listed_head(action, True)}: valid; {segment}"
