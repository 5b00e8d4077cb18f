"""Checked verdicts for TextWorld: a ``prepare meal`` trace that finds an ingredient missing gets the game's refusal.

The recipe annotator (:mod:`dreamgym.envs.textworld.explain`, ``annotator_options: {recipe: true}``) opens the trace
of a ``prepare meal`` with what the recipe asks and what is carried::

    "prepare meal" listed: valid; recipe: pork chop, water; carried: pork chop; missing water; location Kitchen; score 0.25; reward 0

With ``computed_premises`` the env writes that opening and the experience model writes the rest, the page included.
The game makes a meal exactly when nothing is missing; otherwise it answers "You still miss something." and changes
nothing else. The 1.3M-parameter model copies the opening but writes a meal anyway for about half of the meals one
ingredient short, and the policy is then paid for eating it (journal, "Three seeds of GRPO-real ... steps without
effect": the dream's commonest false reward). So, as :mod:`dreamgym.envs.shop.recheck` does for a purchase,
:func:`recheck_meal` keeps what the trace compares (the recipe and the carried ingredients it wrote) and recomputes
what follows from it: when an ingredient is missing, the page is the prompt's STATE with the refusal as its feedback,
the reward 0 and the episode goes on. When nothing is missing the model's page stands (a made meal's page is new
text, which the model writes), and the checker reads nothing (None).

Applied to the annotator's own refused prepares it returns the real page (tested on collected games), so a model that
already refuses loses nothing.
"""

from __future__ import annotations

import re

from dreamgym.envs.base import Element
from dreamgym.envs.explain_diff import ParsedState
from dreamgym.envs.textworld.policies import PREPARE
from dreamgym.types import ExperiencePrediction

REFUSAL = "You still miss something."  # the game's feedback to a prepare that lacks an ingredient
_SCORE = re.compile(r"^score (\d+(?:\.\d+)?)")


def _names(clause: str, key: str) -> list[str] | None:
    """``a, b`` of a ``key: a, b`` clause (``none`` is the empty list), None when ``clause`` is not one."""
    if not clause.startswith(key + ": "):
        return None
    text = clause.removeprefix(key + ": ").strip()
    return [] if text == "none" else [n.strip() for n in text.split(",") if n.strip()]


def refusal_page(state: str) -> str:
    """``state`` with its feedback element's text replaced by :data:`REFUSAL` (one added after the header when it has
    none): the page the game writes for a refused prepare."""
    lines = state.splitlines()
    for i, line in enumerate(lines):
        element = Element.parse(line)
        if element is not None and element.type == "feedback":
            lines[i] = Element(element.id, "feedback", REFUSAL).render()
            return "\n".join(lines)
    at = 1 if lines and not lines[0].startswith("[") else 0
    return "\n".join([*lines[:at], Element("f", "feedback", REFUSAL).render(), *lines[at:]])


def recheck_meal(state: str, action: str, pred: ExperiencePrediction) -> ExperiencePrediction | None:
    """``pred`` with the game's refusal when its ``prepare meal`` trace's recipe and carried clauses leave an
    ingredient missing (see the module docstring); None for another action, a trace without those clauses, or one
    with nothing missing (nothing to check)."""
    if action != PREPARE or not pred.reasoning:
        return None
    clauses = pred.reasoning.split("; ")
    found = [(i, names) for key in ("recipe", "carried") for i, c in enumerate(clauses)
             if (names := _names(c, key)) is not None]
    if len(found) != 2 or found[1][0] != found[0][0] + 1:
        return None
    (at, recipe), (_, carried) = found
    missing = [n for n in recipe if n not in carried]
    if not recipe or not missing:
        return None
    score = next((m[1] for c in clauses[at + 2:] if (m := _SCORE.match(c))), None)
    location = ParsedState.parse(state).header[1]
    trace = [*clauses[:at + 2], f"missing {', '.join(missing)}", *([f"location {location}"] if location else []),
             *([f"score {score}"] if score is not None else []), "reward 0"]
    return ExperiencePrediction("; ".join(trace), refusal_page(state), 0.0, False, False)
