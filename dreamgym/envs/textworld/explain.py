"""TextWorld's rule-based annotator: one trace per real transition, from the recorded states and a replay of
the game's score (see :mod:`dreamgym.envs.explain_diff`)::

    "open fridge" listed: valid; location Kitchen; command +close fridge +take milk from fridge -open fridge; score 0.00; reward 0
"""

from __future__ import annotations

from dreamgym.envs.explain_diff import explain_text_trajectory
from dreamgym.types import Explanation, Trajectory

ELEMENT_TYPES = ("carrying", "command")  # the feedback is new text: the model writes it, the trace does not
ROOM_TYPES = frozenset({"command"})  # what a room change replaces (the inventory travels along)


def explain_trajectory(traj: Trajectory) -> Explanation:
    return explain_text_trajectory(traj, ELEMENT_TYPES, ROOM_TYPES)
