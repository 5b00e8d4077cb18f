"""Copy references: an optional M_exp output protocol in which the model points at text in its prompt instead of
spelling it out, and the parser writes the text in (``ProtocolConfig.copy_refs``).

A next state mostly repeats what the prompt already shows: the element the action names (an item page's title
and price are the clicked link's), the current page (an action that changes nothing), a retrieved neighbour's
next state (the same search). A pre-trained LLM copies such text token by token; a tiny model has to learn that
attention circuit first, and on these CPUs it has not within budget (README, "The pre-trained base"). With copy
references the target names the source instead, the way a pointer-generator network does, and the model has to
learn *what* to copy, not the copying itself. The protocol is env-agnostic: the references are computed from the
prompt's own sections, never from an env's page layout.

References (every literal ``@`` of the text is written ``@@``, so a reference cannot be confused with text):

* whole lines, alone on a line of the state block: ``@N`` / ``@N-M`` are lines N..M of the STATE (1-based line
  positions, not element ids) and ``@N-`` lines N to the last (so a model need not know the page's length);
  ``@n1:N``, ``@n1:N-M``, ``@n1:N-`` the same of neighbour 1's next state (SIMILAR ``(1)``). The encoder points
  at the neighbour only for a whole page (``@n1:1-``, a next state equal to the neighbour's): a page that shares
  a few lines with it (a results page's header) is written out, because a model that starts such a page at line
  4 loses count of its lines (on val, 47 of 81 results pages ran past their last line until the token limit);
* inline, anywhere in the state block or the reasoning: ``@T.i`` is the i-th part of the TARGET element's text
  (the part after ``type: ``; ``@T.0`` the whole text), ``@N.i`` the i-th part of STATE line N's element text,
  for parts with a digit (ids, prices, counts: what a page's layout does not predict; a button's label it does,
  and its line number varies from page to page, so pointing at it would be the harder thing to learn).
  The index is never left out, so a reference always ends where its digits do. Parts are the pieces between `` — ``, `` | `` and ``: ``, e.g. ``B0N38ATR — Torzu Sheets | $42.37``
  has parts ``B0N38ATR``, ``Torzu Sheets``, ``$42.37``;
* an element under a new id (``RefContext.element_refs``), a whole line: ``[c4] @[c2]`` is STATE element ``[c2]``'s
  ``type: text`` under id ``c4``. A page whose ids are positions (TextWorld's ``[c1]..[c16]`` commands) renumbers
  every element a new one precedes, so no line of it equals a STATE line; written out, a tiny model loses which
  element it was copying: after a ``take`` it wrote the new item's commands a second time where the carried
  item's belong, and 101 of 163 valid val pages listed an element twice (real pages: 0). Pointed at by id, the kept
  elements are a rising sequence of ids in the prompt, and the new ones are the only text to write.

:func:`encode_refs` turns a real target into this form (longest source first, TARGET before STATE lines before
the neighbour, so the encoding of a given prompt is unique); :func:`expand_refs` inverts it and returns None
for a reference to nothing (the parser's ``bad_ref`` failure). ``expand_refs(encode_refs(x)) == x`` for every
text (tested).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property

from dreamgym.envs.base import Element

_PART_SEP = re.compile(r"\s+—\s+|\s+\|\s+|:\s+")
_WHOLE_LINE = re.compile(r"@(?:n(\d+):)?(\d+)(?:(-)(\d*))?")
_INLINE = re.compile(r"@@|@T\.(\d+)|@(\d+)\.(\d+)")
_ELEMENT_REF = re.compile(r"\[([^\]\n]+)\] @\[([^\]\n]+)\]")
_DIGIT = re.compile(r"\d")
MIN_PART_CHARS = 3  # shorter parts (a size "m", a unit) are cheaper to write than to point at


def _text_of(line: str) -> str:
    element = Element.parse(line)
    return element.text if element is not None else line.strip()


def parts(text: str) -> list[str]:
    """The whole text, then its pieces between `` — ``, `` | `` and ``: `` (only when there are several)."""
    pieces = [p for p in _PART_SEP.split(text) if p]
    return [text, *pieces] if len(pieces) > 1 else [text]


@dataclass(frozen=True)
class RefContext:
    """What references can point at: the STATE lines, the TARGET line and the neighbours' next-state lines."""

    state_lines: tuple[str, ...]
    target: str | None = None
    neighbour_lines: tuple[tuple[str, ...], ...] = ()
    element_refs: bool = False  # encode an element STATE shows under another id as ``[new] @[old]``

    @classmethod
    def of(cls, state: str, target: str | None, neighbour_next_states: tuple[str, ...] = (),
           element_refs: bool = False) -> RefContext:
        lines = tuple(line.strip() for line in state.strip().splitlines())
        neighbours = tuple(tuple(s.strip() for s in n.strip().splitlines()) for n in neighbour_next_states)
        return cls(lines, target, neighbours, element_refs)

    @cached_property
    def elements(self) -> dict[str, Element]:
        """STATE's elements by id (the first, should a dreamt state repeat an id)."""
        out: dict[str, Element] = {}
        for line in self.state_lines:
            element = Element.parse(line)
            if element is not None:
                out.setdefault(element.id, element)
        return out

    @cached_property
    def element_ids(self) -> dict[tuple[str, str], str]:
        """(type, text) -> the id STATE shows it under (the first)."""
        out: dict[tuple[str, str], str] = {}
        for element in self.elements.values():
            out.setdefault((element.type, element.text), element.id)
        return out

    def inline_sources(self) -> list[tuple[str, str]]:
        """(reference, text) pairs for inline use, longest text first; among equal lengths TARGET before STATE."""
        sources: list[tuple[str, str]] = []
        if self.target is not None:
            sources += [(f"@T.{i}", p) for i, p in enumerate(parts(_text_of(self.target)))]
        for n, line in enumerate(self.state_lines, start=1):  # only parts with a digit: ids, prices, counts
            sources += [(f"@{n}.{i}", p) for i, p in enumerate(parts(_text_of(line))) if _DIGIT.search(p)]
        seen: set[str] = set()
        out = []
        for ref, text in sources:
            if len(text) >= MIN_PART_CHARS and text not in seen:
                seen.add(text)
                out.append((ref, text))
        return sorted(out, key=lambda rt: -len(rt[1]))  # stable: priority order among equal lengths

    @cached_property
    def inline_pattern(self) -> tuple[re.Pattern[str], dict[str, str]] | None:
        """The sources as one regex (longest first) and text -> reference; built once per context, not per line."""
        sources = self.inline_sources()
        if not sources:
            return None
        pattern = re.compile("|".join(rf"(?<!\w){re.escape(t)}(?!\w)" for _, t in sources))
        return pattern, {t: r for r, t in sources}


def _escape(text: str) -> str:
    return text.replace("@", "@@")


def encode_inline(text: str, ctx: RefContext) -> str:
    """``text`` with every occurrence (at word boundaries) of a source part replaced by its reference."""
    if ctx.inline_pattern is None:
        return _escape(text)
    pattern, ref_of = ctx.inline_pattern
    out, pos = [], 0
    for m in pattern.finditer(text):
        out += [_escape(text[pos : m.start()]), ref_of[m.group(0)]]
        pos = m.end()
    out.append(_escape(text[pos:]))
    return "".join(out)


def _element_ref(line: str, ctx: RefContext) -> str | None:
    """``[new] @[old]`` for a line showing a STATE element under another id (``ctx.element_refs``), else None."""
    element = Element.parse(line) if ctx.element_refs else None
    old = None if element is None else ctx.element_ids.get((element.type, element.text))
    if element is None or old is None or "@" in element.id or element.render() != line.strip():
        return None  # an id with a literal @, or a line the element does not render exactly, is written out
    return f"[{element.id}] @[{old}]"


def encode_refs(state: str, ctx: RefContext) -> str:
    """A next state in reference form: lines equal to a STATE line (else, when the whole page is neighbour 1's, to
    its lines) become whole-line references, consecutive ones merged into ranges; with ``ctx.element_refs`` a line
    showing a STATE element under another id becomes ``[new] @[old]``; the other lines get inline references."""
    where: dict[str, str] = {}
    for n, line in enumerate(ctx.state_lines, start=1):
        where.setdefault(line, f"{n}")
    if ctx.neighbour_lines and tuple(line.strip() for line in state.strip().splitlines()) == ctx.neighbour_lines[0]:
        for n, line in enumerate(ctx.neighbour_lines[0], start=1):  # the whole page only (module docstring)
            where.setdefault(line, f"n1:{n}")
    out: list[str] = []
    run: tuple[str, int, int] | None = None  # (source prefix, first, last) of the current range

    def flush() -> None:
        if run is not None:
            prefix, first, last = run
            size = len(ctx.state_lines) if not prefix else len(ctx.neighbour_lines[0])
            end = "-" if last == size else f"-{last}"  # "to the end": no need to know the page's length
            out.append(f"@{prefix}{first}" + (end if last > first else ""))

    for line in state.strip().splitlines():
        ref = where.get(line)
        if ref is None:
            flush()
            run = None
            out.append(_element_ref(line, ctx) or encode_inline(line, ctx))
            continue
        prefix, _, num = ref.rpartition(":")
        prefix = f"{prefix}:" if prefix else ""
        if run is not None and run[0] == prefix and run[2] + 1 == int(num):
            run = (prefix, run[1], int(num))
        else:
            flush()
            run = (prefix, int(num), int(num))
    flush()
    return "\n".join(out)


def expand_inline(text: str, ctx: RefContext) -> str | None:
    """Inverse of :func:`encode_inline`; None when a reference points at nothing."""
    failed = False

    def sub(m: re.Match[str]) -> str:
        nonlocal failed
        if m.group(0) == "@@":
            return "@"
        if m.group(0).startswith("@T"):
            if ctx.target is None:
                failed = True
                return ""
            pieces, i = parts(_text_of(ctx.target)), int(m.group(1))
        else:
            n, i = int(m.group(2)), int(m.group(3))
            if not 1 <= n <= len(ctx.state_lines):
                failed = True
                return ""
            pieces = parts(_text_of(ctx.state_lines[n - 1]))
        if i >= len(pieces):
            failed = True
            return ""
        return pieces[i]

    out = _INLINE.sub(sub, text)
    return None if failed else out


def expand_refs(state: str, ctx: RefContext) -> str | None:
    """The next state with every reference written out; None when one points at nothing."""
    lines: list[str] = []
    for line in state.strip().splitlines():
        whole = _WHOLE_LINE.fullmatch(line)
        if whole is not None:
            source = ctx.state_lines if whole.group(1) is None else (
                ctx.neighbour_lines[int(whole.group(1)) - 1] if 1 <= int(whole.group(1)) <= len(ctx.neighbour_lines)
                else ())
            first = int(whole.group(2))
            last = int(whole.group(4)) if whole.group(4) else len(source) if whole.group(3) else first
            if not 1 <= first <= last <= len(source):
                return None
            lines += source[first - 1 : last]
            continue
        element_ref = _ELEMENT_REF.fullmatch(line.strip())
        if element_ref is not None:  # never literal text: a literal @ is written @@
            element = ctx.elements.get(element_ref.group(2))
            if element is None:
                return None
            lines.append(replace(element, id=element_ref.group(1)).render())
            continue
        expanded = expand_inline(line, ctx)
        if expanded is None:
            return None
        lines.append(expanded)
    return "\n".join(lines)
