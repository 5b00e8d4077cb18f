"""ScienceWorld's rule-based annotator: one trace per real transition, from the recorded states and a replay
of the task's score (see :mod:`dreamgym.envs.explain_diff`). ScienceWorld accepts actions its menu does
not list, so a trace tells ``listed`` from ``valid``::

    "open door to hallway" listed: valid; location kitchen; door +door to hallway (open) -door to hallway (closed); action +go to hallway -open door to hallway; score 0.08; reward 0
"""

from __future__ import annotations

from dreamgym.envs.explain_diff import explain_text_trajectory
from dreamgym.types import Explanation, Trajectory

ELEMENT_TYPES = ("object", "door", "inventory", "action")
ROOM_TYPES = frozenset({"object", "door", "action"})  # what a room change replaces (the inventory travels along)


def explain_trajectory(traj: Trajectory) -> Explanation:
    return explain_text_trajectory(traj, ELEMENT_TYPES, ROOM_TYPES)
