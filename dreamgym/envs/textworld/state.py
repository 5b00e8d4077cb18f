"""The TextWorld state mapper: a game state -> the compact abstract state a small model reads and writes.

Format (one element per line after a header)::

    location: Kitchen
    [f] feedback: You open the fridge, revealing a milk.
    [i1] carrying: a red hot pepper
    [c1] command: close fridge
    [c2] command: go north
    ...

* ``feedback`` is the game's last message with the ASCII banner, the ``-= Room =-`` title and runs of
  whitespace removed, cut to ``max_text`` characters (the room text after ``look``/``go`` is long and mostly
  flavour; the commands carry its actionable content).
* ``command`` elements are the admissible commands, capped at ``max_commands``: when there are more, the
  ``examine X`` commands (information only) are dropped first, then the list is cut in TextWorld's own
  (alphabetical) order. ``look`` and ``inventory`` are always dropped — the state already shows both.
* ``numbered=False`` gives every command the id ``c`` and every carried item ``i`` (a command is named by its text,
  not its id). With positional ids an action that adds one command renumbers every later one, so the next state
  shares almost no line with the state, and M_exp's copy references (``ProtocolConfig.copy_refs``) point at whole
  lines: on a 960-episode seed its targets' median fell from 452 to 325 tokens. But a line reference is then a count
  with no id on the page to count by, and on val that M_exp scored the games' ends worse (0.80 against 0.90;
  configs/textworld-bench-unnumbered.yaml), so the bench keeps numbered pages.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dreamgym.envs.base import Element, format_elements, truncate

ROOM_TITLE_RE = re.compile(r"-=\s*(.*?)\s*=-")
BANNER_CHARS = set("_|$\\/<> \t")
PROMPT_RE = re.compile(r"\s*>\s*(-?\d+/\d+)?\s*$")  # the interpreter's trailing "> score/moves" prompt
COMMAND_RE = re.compile(r"^\[c\d*\] command: (.+)$", re.MULTILINE)  # numbered or not
REDUNDANT_COMMANDS = {"look", "inventory"}


def clean_text(text: str, max_chars: int) -> str:
    """One line: no ASCII-art banner lines, no room title, single spaces, at most ``max_chars``."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not set(ln) <= BANNER_CHARS]
    flat = PROMPT_RE.sub("", " ".join(ROOM_TITLE_RE.sub(" ", " ".join(lines)).split()))
    return truncate(flat, max_chars)


def room_name(description: str) -> str | None:
    """The room's name from its ``-= Kitchen =-`` title (None if the text has none)."""
    match = ROOM_TITLE_RE.search(description)
    return match.group(1) if match else None


def inventory_items(inventory: str) -> list[str]:
    """TextWorld's inventory text -> the carried items (``[]`` when empty-handed). Two layouts occur:
    ``"You are carrying:\\n  a milk\\n  a knife"`` and one line, ``"You are carrying: some oil and a cookbook."``."""
    lines = [ln.strip() for ln in inventory.splitlines() if ln.strip()]
    if not lines or "nothing" in lines[0].lower():
        return []
    rest = lines[0].partition(":")[2].strip().rstrip(".")
    items = re.split(r",\s*(?:and\s+)?|\s+and\s+", rest) if rest else lines[1:]  # one line: "a, b and c."
    return [" ".join(item.split()) for item in items if item.strip()]


def shown_commands(admissible: Sequence[str], max_commands: int) -> list[str]:
    """The admissible commands the state lists (see the module docstring for the capping rule)."""
    commands = [c for c in admissible if c not in REDUNDANT_COMMANDS]
    if len(commands) > max_commands:
        acting = [c for c in commands if not c.startswith("examine ")]
        commands = (acting + [c for c in commands if c.startswith("examine ")])[:max_commands]
    return commands


def abstract_state(location: str | None, feedback: str, inventory: str, commands: Sequence[str], max_text: int,
                   numbered: bool = True) -> str:
    """Render the abstract state (see the module docstring)."""

    def ids(prefix: str, n: int) -> list[str]:
        return [f"{prefix}{k}" for k in range(1, n + 1)] if numbered else [prefix] * n

    items = inventory_items(inventory)
    elements = [Element("f", "feedback", clean_text(feedback, max_text) or "(nothing happens)")]
    elements += [Element(i, "carrying", item) for i, item in zip(ids("i", len(items)), items, strict=True)]
    elements += [Element(i, "command", cmd) for i, cmd in zip(ids("c", len(commands)), commands, strict=True)]
    return format_elements(elements, header=f"location: {location or 'unknown'}")


def commands_in_state(state: str) -> list[str]:
    """The commands an abstract state lists, plus ``look``/``inventory`` (always admissible)."""
    return [*COMMAND_RE.findall(state), *sorted(REDUNDANT_COMMANDS)]


def take_step(state: str, action: str, admissible: Sequence[str]) -> bool:
    """Whether ``action`` takes one of two or more things the agent could take (TextWorld's
    ``EnvSpec.decision_step``): on a cooking game, the choice of ingredient that the recipe's words decide, which
    behaviour cloning can show ``bc_decision_repeat`` times (``state`` is not needed: the commands are the list)."""
    takes = [a for a in admissible if a.startswith("take ")]
    return action in takes and len(takes) >= 2
