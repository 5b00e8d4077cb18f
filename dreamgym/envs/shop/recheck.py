"""Checked verdicts: the shop's purchase trace with its comparisons recomputed from the text the model wrote.

A purchase trace (:func:`~dreamgym.envs.shop.explain.purchase_trace`) states each check of the purchase reward
as the two things it compares and a verdict, then the score::

    buy B0N38ATR; type bed sheets=bed sheets y; attr cotton title y; attr cooling unseen n; \
opt size=queen sel y; price 42.37<=70.00 y; score 4/5=0.80 -> done

Writing the compared things is copying (the task's words, the page's price), which the tiny experience model
does well with copy references; the verdicts and the count are comparisons, which it does not learn in its
budget: it writes ``y`` and ``1.00`` for nearly every purchase (README, "Checked verdicts"). So, as a program-aided
model hands its arithmetic to an interpreter, :func:`recheck_purchase` keeps what the model chose to compare and
recomputes what follows from it, using only that text and the prompt's STATE (the item page being bought from):

* ``type A=B``: ``y`` iff the two product types the model wrote are the same text;
* ``attr X title|unseen``: ``title y`` iff ``X`` is in the item page's title line (as whole words); otherwise
  ``unseen`` with the model's own verdict, since the item page does not show the product's other attributes;
* ``opt N=V sel``: ``y`` iff the item page has the line ``option: N=V (selected)``;
* ``price P<=B``: the two numbers the model wrote compared (``no limit`` is always ``y``);
* ``score``: the checks met over the checks (``0.1*`` in front when the type check fails), with 2 decimals, as
  :func:`~dreamgym.envs.shop.reward.purchase_reward` scores; the reward, the success flag and the done page's
  ``Your score`` line follow it.

A trace may start with the task's goal (``want headphones; attr foldable; opt color=white; price <=220.00 | ``,
``benchmarks/goal_line.py``): that part is kept as written and the purchase after it is checked. A trace that is not
a purchase, or whose clauses do not read as above, is returned unchanged (the caller counts it). Applied to the
annotator's own traces it changes nothing (tested on collected data), so a model that already writes the right
verdicts loses nothing.
"""

from __future__ import annotations

import re
from dataclasses import replace

from dreamgym.envs.base import parse_elements
from dreamgym.envs.shop.reward import SUCCESS_EPS, TYPE_MISMATCH
from dreamgym.types import ExperiencePrediction

_CLAUSE = {
    "type": re.compile(r"^type (?P<a>.+?)=(?P<b>.+) [yn]$"),
    "attr": re.compile(r"^attr (?P<x>.+) (?:title|unseen) (?P<v>[yn])$"),
    "opt": re.compile(r"^opt (?P<o>.+=.+) sel [yn]$"),
    "price": re.compile(r"^price \$?(?P<p>\d+(?:\.\d+)?)<=(?P<b>no limit|\$?\d+(?:\.\d+)?) [yn]$"),
}
_SCORE = re.compile(r"^score .*? -> done$")
_YOUR_SCORE = re.compile(r"(Your score \(min 0\.0, max 1\.0\): )[0-9.]+")


def _yn(ok: bool) -> str:
    return "y" if ok else "n"


def _title(state: str) -> str:
    """The item page's title: the text of its first line, after the product id (``B0N38ATR — <title>``)."""
    elements = parse_elements(state)
    return elements[0].text.partition(" — ")[2].lower() if elements else ""


def _in_title(attribute: str, title: str) -> bool:
    return re.search(rf"(?<![a-z0-9]){re.escape(attribute.lower())}(?![a-z0-9])", title) is not None


GOAL_SEP = " | "  # ends a trace's leading goal part (``want ...``)


def split_goal(trace: str) -> tuple[str, str]:
    """``(goal part with its separator, the rest)`` of a trace that starts with ``want ``; else ``("", trace)``."""
    if trace.startswith("want ") and GOAL_SEP in trace:
        goal, _, rest = trace.partition(GOAL_SEP)
        return goal + GOAL_SEP, rest
    return "", trace


def recheck_purchase(state: str, action: str, pred: ExperiencePrediction) -> ExperiencePrediction | None:
    """``pred`` with the verdicts, score, reward, success and done page of its purchase trace recomputed (see the
    module docstring); None when ``pred.reasoning`` is not a purchase trace this reads (nothing to check)."""
    del action  # the trace names the purchase; the action's spelling differs by env (shop, browser)
    goal, trace = split_goal(pred.reasoning or "")
    if not trace.startswith("buy"):
        return None
    head, *clauses = trace.split("; ")
    if not clauses or not _SCORE.match(clauses[-1]):
        return None
    selected = {e.text for e in parse_elements(state) if e.type == "option" and e.text.endswith(" (selected)")}
    title = _title(state)
    type_ok, met, checks, out = True, 0, 0, [head]
    for clause in clauses[:-1]:
        kind = clause.partition(" ")[0]
        m = _CLAUSE[kind].match(clause) if kind in _CLAUSE else None
        if m is None:
            return None
        if kind == "type":
            type_ok = m["a"].strip().lower() == m["b"].strip().lower()
            out.append(f"type {m['a']}={m['b']} {_yn(type_ok)}")
            continue
        if kind == "attr":
            shown = _in_title(m["x"], title)
            ok = shown or m["v"] == "y"
            out.append(f"attr {m['x']} {'title' if shown else 'unseen'} {_yn(ok)}")
        elif kind == "opt":
            ok = f"{m['o']} (selected)" in selected
            out.append(f"opt {m['o']} sel {_yn(ok)}")
        else:
            ok = m["b"] == "no limit" or float(m["p"]) <= float(m["b"].lstrip("$")) + 1e-9
            out.append(f"price {m['p']}<={m['b']} {_yn(ok)}")
        met += ok
        checks += 1
    if checks == 0:
        return None
    written = f"{(1.0 if type_ok else TYPE_MISMATCH) * met / checks:.2f}"  # as the annotator and the done page write it
    score = float(written)
    factor = "" if type_ok else f"{TYPE_MISMATCH:g}*"
    out.append(f"score {factor}{met}/{checks}={written} -> done")
    next_state = _YOUR_SCORE.sub(lambda s: s[1] + written, pred.next_state)
    return replace(pred, reasoning=goal + "; ".join(out), next_state=next_state, reward=score,
                   success=abs(score - 1.0) < SUCCESS_EPS, done=True)
