"""Checked verdicts for TextWorld: a short meal gets the game's refusal, a win the game rules out is rejected.

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

The game is won in one way only: eating a meal that is carried. With the false meals refused, the policy found the
next false reward in seed 0's dream: an ``open`` answered with the game's ending ("You eat the meal. ... *** The
End ***", 75 of its 76 paid episodes without a meal). :func:`recheck_step`, the env's ``trace_checker``, therefore
also rejects a dreamt win at any other step (``failure="unreachable_win"``): the experience model resamples it and,
after its resamples, serves the failure state (the page unchanged, reward 0, not done), as for any answer it cannot
use. A loss (done, reward 0) and every other page stand as written.

A meal is made by ``prepare meal`` only (a dropped one can be taken again). Seed 1's checked dream (session 27)
carried one after 18 other steps, e.g. an ``open fridge`` answered "Adding the meal to your inventory", then paid for
eating it; a page that adds a meal at any step but ``prepare meal`` or ``take meal`` is rejected as well
(``failure="meal_from_nowhere"``; the first version let any ``take`` pass, and the no-effect val runs of session 28
found ``take milk from fridge`` answered with a meal). The real game's steps pass every rule (tested on collected
games).
"""

from __future__ import annotations

import re
from dataclasses import replace

from dreamgym.envs.base import Element
from dreamgym.envs.explain_diff import ParsedState
from dreamgym.envs.textworld.explain import carries, meals, names_item, taken_item
from dreamgym.envs.textworld.policies import PREPARE
from dreamgym.types import ExperiencePrediction

REFUSAL = "You still miss something."  # the game's feedback to a prepare that lacks an ingredient
EAT_MEAL = "eat meal"  # the one winning command (tw-cooking games), with a meal carried
UNREACHABLE_WIN = "unreachable_win"  # the failure a rejected win is resampled, then served, under
MEAL_FROM_NOWHERE = "meal_from_nowhere"  # ... and a meal carried after a step that cannot make or take one
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
    # the first recipe clause and the carried clause right after it: with computed_premises the env's, and what
    # the model writes after them (it may write its own carried list again, e.g. "carried: a, b; none missing")
    # does not change what was carried
    at, recipe = next(((i, names) for i, c in enumerate(clauses) if (names := _names(c, "recipe")) is not None),
                      (len(clauses), None))
    if recipe is None or at + 1 >= len(clauses) or (carried := _names(clauses[at + 1], "carried")) is None:
        return None
    missing = [n for n in recipe if n not in carried]
    if not recipe or not missing:
        return None
    score = next((m[1] for c in clauses[at + 2:] if (m := _SCORE.match(c))), None)
    location = ParsedState.parse(state).header[1]
    trace = [*clauses[:at + 2], f"missing {', '.join(missing)}", *([f"location {location}"] if location else []),
             *([f"score {score}"] if score is not None else []), "reward 0"]
    return ExperiencePrediction("; ".join(trace), refusal_page(state), 0.0, False, False)


def recheck_step(state: str, action: str, pred: ExperiencePrediction) -> ExperiencePrediction | None:
    """TextWorld's trace checker (``EnvSpec.trace_checker``): a ``prepare meal`` as :func:`recheck_meal` reads it;
    any other dreamt win (done with a reward) that is not ``eat meal`` with a meal carried in ``state``, and a meal
    carried after any step but ``prepare meal`` or ``take meal`` (from anywhere), rejected (``failure`` set:
    resampled, then the failure state); None (nothing to check) otherwise."""
    if action == PREPARE:
        return recheck_meal(state, action, pred)
    if pred.done and pred.reward > 0 and not (action == EAT_MEAL and carries(state, "meal")):
        return replace(pred, failure=UNREACHABLE_WIN)
    taken = taken_item(action)
    if not (taken is not None and names_item(taken, "meal")) and meals(pred.next_state) > meals(state):
        return replace(pred, failure=MEAL_FROM_NOWHERE)
    return None
