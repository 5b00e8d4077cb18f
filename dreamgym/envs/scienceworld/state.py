"""The ScienceWorld state mapper: the simulator's text -> a compact abstract state, and its action list.

Format::

    location: kitchen
    [f] feedback: The door is now open.
    [o1] object: a chair. On the chair is: nothing.
    [d1] door: door to hallway (open)
    [i1] inventory: an orange
    [a1] action: go to hallway
    ...

Objects and doors come from ScienceWorld's free ``look`` (no game time passes), the inventory from its free
``inventory``, each sorted (the simulator's own order changes between resets); ``the agent`` and ``air`` are left out, every text is cut to ``max_text`` characters.
The ``action`` elements are the actions a policy is shown (see :func:`derived_actions` and
:func:`verified_actions`); ScienceWorld's parser accepts more (any valid action works), so the list is a menu,
not the full grammar.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dreamgym.envs.base import Element, format_elements, truncate

LOCATION_RE = re.compile(r"This (?:room|outside location) is called the (.+?)\.")
DOOR_RE = re.compile(r"^A door to the (.+?) \(that is (open|closed)\)", re.IGNORECASE)
ACTION_RE = re.compile(r"^\[a\d+\] action: (.+)$", re.MULTILINE)
IGNORED_OBJECTS = ("the agent", "a substance called air")
ARTICLE_RE = re.compile(r"^(?:a|an|the|some)\s+(?:substance called\s+)?", re.IGNORECASE)

ALWAYS_VALID = ("look around", "inventory", "wait1")


@dataclass(frozen=True)
class Room:
    """What ScienceWorld's ``look`` shows: the location, its objects and its doors (name, open?)."""

    location: str
    objects: tuple[str, ...]
    doors: tuple[tuple[str, bool], ...]


def parse_look(look: str) -> Room:
    match = LOCATION_RE.search(look)
    objects: list[str] = []
    doors: list[tuple[str, bool]] = []
    for raw in look.splitlines()[1:]:
        line = " ".join(raw.split())
        if not line or line.lower().startswith("you also see") or line in IGNORED_OBJECTS:
            continue
        door = DOOR_RE.match(line)
        if door:
            doors.append((door.group(1), door.group(2).lower() == "open"))
        else:
            objects.append(line)
    # Sorted: the simulator lists a room's contents in hash-set order, which changes between resets.
    return Room(match.group(1) if match else "unknown", tuple(sorted(objects)), tuple(sorted(doors)))


def parse_inventory(inventory: str) -> list[str]:
    """``"In your inventory, you see:\\n\\tan orange"`` -> ``["an orange"]``."""
    return sorted(" ".join(ln.split()) for ln in inventory.splitlines()[1:] if ln.strip())


def short(text: str, max_chars: int) -> str:
    flat = " ".join(text.split())
    return truncate(flat, max_chars)


def referent(description: str) -> str:
    """The name ScienceWorld's parser knows an object by: ``"a fire pit (containing nothing)"`` -> ``fire pit``."""
    name = ARTICLE_RE.sub("", description.strip())
    return re.split(r"\s*\(|\.\s|\.$|:|,", name, maxsplit=1)[0].strip()


def derived_actions(room: Room, inventory: Sequence[str]) -> list[str]:
    """A cheap action menu from the room text alone (no call to the simulator's valid-action search):
    doors (open if closed, else go to), then focus on / pick up / look at each object, the held objects'
    focus on / look at, and ``look around``/``wait1``. Entries are usually, not always, valid (a name may be
    ambiguous — ScienceWorld then asks, and the env picks its first reading)."""
    actions = [f"go to {name}" if is_open else f"open door to {name}" for name, is_open in room.doors]
    names = [referent(o) for o in room.objects]
    for verb in ("focus on", "pick up", "look at"):
        actions += [f"{verb} {n}" for n in names if n]
    held = [referent(i) for i in inventory]
    for verb in ("focus on", "look at"):
        actions += [f"{verb} {n}" for n in held if n]
    return list(dict.fromkeys([*actions, "look around", "wait1"]))


def verified_actions(candidates: Sequence[str], valid: Iterable[str]) -> list[str]:
    """The candidates the simulator also lists among its valid action-object combinations (the exact menu
    of ``admissible=True``). The simulator's own list (hundreds to thousands of entries, mostly ``connect``
    pairs and actions on rooms, doors and the air) is not shown as is: it is too long for a small model and
    a few of its entries are still rejected by ScienceWorld's parser."""
    valid_set = set(valid)
    return [a for a in candidates if a in valid_set or a in ALWAYS_VALID]


def abstract_state(room: Room, inventory: Sequence[str], feedback: str, actions: Sequence[str], max_text: int) -> str:
    """Render the abstract state (see the module docstring)."""
    if LOCATION_RE.match(feedback.strip()):  # the feedback of "look around" is the room itself
        feedback = "You look around."
    elements = [Element("f", "feedback", short(feedback, max_text) or "(nothing happens)")]
    elements += [Element(f"o{k}", "object", short(o, max_text)) for k, o in enumerate(room.objects, 1)]
    elements += [Element(f"d{k}", "door", f"door to {n} ({'open' if o else 'closed'})") for k, (n, o) in enumerate(room.doors, 1)]
    elements += [Element(f"i{k}", "inventory", short(i, max_text)) for k, i in enumerate(inventory, 1)]
    elements += [Element(f"a{k}", "action", a) for k, a in enumerate(actions, 1)]
    return format_elements(elements, header=f"location: {room.location}")


def actions_in_state(state: str) -> list[str]:
    return ACTION_RE.findall(state)
