"""Recorded effects for TextWorld: what opening a container shows, carried over from the same game's real record.

What a closed container holds is hidden until it is opened, and it is the same whenever the game opens it (until the
player moves something in or out). The offline data opened the same container in the same game for 126 of 166
dreamt opens it never made from that state (session 24), but the 1.3M M_exp does not copy it: shown the same game's
open in its prompt (``ProtocolConfig.task_neighbours``), it writes the recorded contents for 140 of 386 of the dream's
own opens, against 141 for "no ingredient" (benchmarks/results/open_probe_textworld_neighbour.json).
:func:`open_effect` (``TextWorldEnv.recorded_effect``) writes the page instead, as the game builds it
(:mod:`dreamgym.envs.textworld.state`), from the dreamt state and a real open of the same container in the same game:
the recorded feedback ("You open the fridge, revealing ..."), the commands that open added for the container's contents
(``take X from fridge``, ``examine X``) and the ``close`` that replaces the ``open``, and an ``insert Y into fridge`` for
each item the dreamt state carries (its ``drop Y`` commands), not the recorded state's. Commands are listed in
TextWorld's order (alphabetical; over the env's ``max_commands``, the acting ones before ``examine``, then cut).
"""

from __future__ import annotations

from dreamgym.envs.base import Element, format_elements, parse_elements
from dreamgym.envs.textworld.state import shown_commands

_OPEN = "open "


def _commands(elements: list[Element]) -> list[str]:
    return [e.text for e in elements if e.type == "command"]


def open_effect(state: str, action: str, recorded_state: str, recorded_next_state: str, max_commands: int) -> str | None:
    """The page the game shows for ``open X`` from ``state``, given a real ``open X`` of the same game from
    ``recorded_state`` that showed ``recorded_next_state`` (see the module docstring); None for another action, an
    ``open X`` that neither page offers, or a record that did not open X (its page still offers it)."""
    if not action.startswith(_OPEN):
        return None
    container = action.removeprefix(_OPEN)
    elements, before, after = parse_elements(state), parse_elements(recorded_state), parse_elements(recorded_next_state)
    first = state.strip().splitlines()[:1]
    header = first[0] if first and Element.parse(first[0]) is None else None  # "location: Kitchen"
    have, had, shown = _commands(elements), _commands(before), _commands(after)
    if action not in have or action not in had or action in shown:
        return None
    feedback = next((e.text for e in after if e.type == "feedback"), None)
    if feedback is None:
        return None
    carried = {c.removeprefix("drop ") for c in have if c.startswith("drop ")}
    inserts = {f"insert {item} into {container}" for item in carried}
    opened = [c for c in shown if c not in had and not c.startswith("insert ")]  # the contents, the close
    # the open itself goes; a command the record's next page lacks otherwise was cut by the cap, not by the open
    commands = sorted({*(c for c in have if c != action), *opened, *inserts})
    commands = shown_commands(commands, max_commands)
    items = [e for e in elements if e.type == "carrying"]
    numbered = any(e.id[1:] for e in elements if e.type == "command")  # TextEnv(numbered=False) writes [c]

    def ids(prefix: str, n: int) -> list[str]:
        return [f"{prefix}{k}" if numbered else prefix for k in range(1, n + 1)]

    out = [Element("f", "feedback", feedback),
           *(Element(i, "carrying", e.text) for i, e in zip(ids("i", len(items)), items, strict=True)),
           *(Element(i, "command", c) for i, c in zip(ids("c", len(commands)), commands, strict=True))]
    return format_elements(out, header=header)
