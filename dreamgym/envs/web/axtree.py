"""A page's accessibility tree as the project's abstract state, in BrowserGym's manner.

1. :data:`MARK_BIDS_JS` gives every element of the document a ``data-bid`` attribute (a number; elements keep
   theirs while the page lives, new ones get the next numbers), so an action names an element by its bid and
   Playwright finds it with ``[data-bid="..."]``.
2. Chromium's own accessibility tree (CDP ``Accessibility.getFullAXTree``: the roles, names, values and states a
   screen reader gets) is joined to the bids through the DOM (``DOM.getDocument``: backend node id -> ``data-bid``),
   as BrowserGym joins its AXTree to its DOM snapshot.
3. :func:`render` writes one line per element that has something to say, ``[bid] role: name`` plus its
   value and states (``value="..."``, ``(checked)``, ``(selected)``, ``(disabled)``...); a text node is a
   ``[bid] text: ...`` line with the bid of the element holding it, unless the name or value of an enclosing
   element already says it (a link's text is its name). Ignored nodes and unnamed containers (generic, list, paragraph...) add no line of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dreamgym.envs.base import Element, truncate

BID_ATTR = "data-bid"

# Marks the document's elements (body and below; head/script/style carry nothing to act on); returns the
# page's title.
MARK_BIDS_JS = """() => {
  const w = window;
  if (w.__dgNextBid === undefined) w.__dgNextBid = 1;
  const root = document.body || document.documentElement;
  const skip = new Set(['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE']);
  for (const el of [root, ...root.querySelectorAll('*')]) {
    if (!skip.has(el.tagName) && !el.hasAttribute('data-bid')) el.setAttribute('data-bid', String(w.__dgNextBid++));
  }
  return document.title;
}"""

# roles that are structure only: a line only when they are named
CONTAINERS = {"generic", "none", "presentation", "paragraph", "list", "listitem", "group", "main", "form",
              "section", "article", "div", "Section", "LayoutTable", "LayoutTableRow", "LayoutTableCell",
              "table", "row", "rowgroup", "search", "navigation", "region", "banner", "contentinfo",
              "complementary", "radiogroup", "Pre", "blockquote", "figure", "LabelText", "strong", "emphasis",
              "superscript", "subscript", "time", "code", "mark", "insertion", "deletion"}
SKIP = {"InlineTextBox", "LineBreak", "RootWebArea", "WebArea", "Iframe", "ListMarker", "MenuListPopup"}
CLICKABLE = {"link", "button", "radio", "checkbox", "menuitem", "menuitemradio", "menuitemcheckbox", "tab",
             "switch", "treeitem"}
EDITABLE = {"textbox", "searchbox"}
STATES = ("checked", "selected", "pressed", "expanded", "disabled", "required")
MAX_NAME = 200


@dataclass(frozen=True)
class AXElement:
    """One line of the observation: an element (or text) with its bid, role, name, value and states."""

    bid: str
    role: str
    name: str
    value: str = ""
    states: tuple[str, ...] = ()
    options: tuple[str, ...] = ()  # a select's option labels (for select[bid][option])

    def render(self) -> str:
        text = truncate(self.name, MAX_NAME)
        if self.value and self.value != self.name:
            text += f' value="{truncate(self.value, MAX_NAME)}"'
        if self.states:
            text += " " + " ".join(f"({s})" for s in self.states)
        return Element(self.bid, self.role, text.strip()).render()

    @property
    def clickable(self) -> bool:
        return self.role in CLICKABLE

    @property
    def editable(self) -> bool:
        return self.role in EDITABLE or (self.role == "combobox" and not self.options)


def bid_map(document: dict[str, Any]) -> dict[int, str]:
    """``backendNodeId -> bid`` of every marked element of a ``DOM.getDocument(depth=-1)`` answer."""
    out: dict[int, str] = {}
    stack = [document.get("root", document)]
    while stack:
        node = stack.pop()
        attrs = node.get("attributes") or []
        for i in range(0, len(attrs) - 1, 2):
            if attrs[i] == BID_ATTR:
                out[int(node["backendNodeId"])] = attrs[i + 1]
                break
        stack.extend(node.get("children") or [])
        stack.extend(node.get("shadowRoots") or [])
        if "contentDocument" in node:
            stack.append(node["contentDocument"])
    return out


def _value(node: dict[str, Any], key: str) -> Any:
    field = node.get(key) or {}
    return field.get("value", "") if isinstance(field, dict) else ""


def _states(node: dict[str, Any]) -> tuple[str, ...]:
    props = {p.get("name"): (p.get("value") or {}).get("value") for p in node.get("properties") or []}
    out = []
    for state in STATES:
        value = props.get(state)
        if value in (True, "true", "mixed"):
            out.append(state if value != "mixed" else f"{state}=mixed")
    return tuple(out)


def extract(ax_nodes: list[dict[str, Any]], bids: dict[int, str]) -> list[AXElement]:
    """The observation's elements, in document order, from ``Accessibility.getFullAXTree``'s nodes."""
    by_id = {n["nodeId"]: n for n in ax_nodes}
    roots = [n for n in ax_nodes if not n.get("parentId") or n["parentId"] not in by_id]
    out: list[AXElement] = []
    # depth-first in document order, iteratively (a deeply nested page must not hit Python's recursion limit)
    stack: list[tuple[dict[str, Any], str, tuple[str, ...]]] = [(r, "", ()) for r in reversed(roots)]
    while stack:
        node, inherited_bid, names = stack.pop()
        bid = bids.get(int(node.get("backendDOMNodeId") or -1), inherited_bid)
        role = str(_value(node, "role"))
        name = " ".join(str(_value(node, "name")).split())
        child_names = names
        if not node.get("ignored") and role not in SKIP:
            if role == "StaticText":
                if name and bid and not any(name in n for n in names):
                    out.append(AXElement(bid, "text", name))
            elif role == "option" and _is_select_option(node, by_id):
                pass  # a select's options are listed on its combobox line (select[bid][option])
            elif bid and (name or role not in CONTAINERS or role in EDITABLE):
                value = " ".join(str(_value(node, "value")).split())
                options = _select_options(node, by_id) if role == "combobox" else ()
                out.append(AXElement(bid, role, name, value, _states(node), options))
                child_names = (*names, *(x for x in (name, value) if x))
        children = [by_id[c] for c in node.get("childIds") or [] if c in by_id]
        stack.extend((child, bid, child_names) for child in reversed(children))
    return out


def _is_select_option(node: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> bool:
    parent = by_id.get(node.get("parentId", ""))
    while parent is not None:
        role = _value(parent, "role")
        if role == "combobox":
            return True
        if role not in ("MenuListPopup", "listbox", "group", "generic", "none"):
            return False
        parent = by_id.get(parent.get("parentId", ""))
    return False


def _select_options(node: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    out: list[str] = []
    stack = list(reversed(node.get("childIds") or []))
    while stack:
        child = by_id.get(stack.pop())
        if child is None:
            continue
        if _value(child, "role") == "option":
            out.append(" ".join(str(_value(child, "name")).split()))
        else:
            stack.extend(reversed(child.get("childIds") or []))
    return tuple(out)


EMPTY_PAGE = "(no elements on this page)"


def render(elements: list[AXElement], title: str = "") -> str:
    """The abstract state: an optional ``Page: title`` header, then one line per element (a select lists its
    options on its own line: ``[bid] combobox: size value="m" options: s | m | l``)."""
    lines = [f"Page: {title}"] if title else []
    if not elements:  # a page with no accessibility tree is a state too (never empty: M_exp targets need a line)
        lines.append(EMPTY_PAGE)
    for e in elements:
        line = e.render()
        if e.options:
            line += " options: " + " | ".join(e.options)
        lines.append(line)
    return "\n".join(lines)


def admissible(elements: list[AXElement], type_texts: list[str], can_go_back: bool) -> list[str]:
    """BrowserGym-style actions on the page: ``click[bid]`` per clickable element, ``type[bid][text]`` per
    editable one and text of ``type_texts``, ``select[bid][option]`` per option of a select, ``go_back``."""
    actions: list[str] = []
    for e in elements:
        if e.clickable and "disabled" not in e.states:
            actions.append(f"click[{e.bid}]")
        elif e.editable:
            actions.extend(f"type[{e.bid}][{t}]" for t in type_texts)
        if e.options:
            actions.extend(f"select[{e.bid}][{o}]" for o in e.options)
    if can_go_back:
        actions.append("go_back")
    return list(dict.fromkeys(actions))
