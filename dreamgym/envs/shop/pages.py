"""The shop's pages and their abstract textual rendering (the state mapper).

A :class:`ShopState` says where the buyer is (WebShop keeps the same in its URLs); :func:`build_page` turns it
into a :class:`Page`: the elements shown, and what each clickable element does. :class:`ShopStateMapper`
renders a page as the abstract state, one element per line::

    [1] text: Page 1 (results 1-5 of 50)
    [2] button: Back to Search
    [3] button: Next >
    [4] link: B0K2Q9ZD — Ravemi Slim Fit T-Shirt, Cotton | $24.99
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dreamgym.envs.base import Element, format_elements, parse_elements
from dreamgym.envs.shop.catalog import Catalog

PageKind = Literal["search", "results", "item", "description", "features", "done"]
SENTENCE_END = re.compile(r"(?<=\.)\s+")
ClickKind = Literal["back_to_search", "next", "prev", "item", "option", "description", "features", "buy"]


@dataclass(frozen=True)
class ShopState:
    """Everything a page is rendered from; the env moves between states, never mutates one."""

    page: PageKind = "search"
    examples: tuple[str, ...] = ()  # example queries offered as admissible actions on the search page
    query: str = ""
    results: tuple[int, ...] = ()  # catalog indices, best first
    page_no: int = 1
    item: int | None = None  # catalog index of the product on an item/description/features/done page
    selected: tuple[tuple[str, str], ...] = ()  # (option name, value) chosen on the item page
    score: float = 0.0  # the purchase reward, shown on the done page


@dataclass(frozen=True)
class Click:
    """The effect of clicking one element."""

    kind: ClickKind
    item: int | None = None  # for "item"
    option: tuple[str, str] | None = None  # (name, value) for "option"


@dataclass
class Page:
    kind: PageKind
    elements: list[Element] = field(default_factory=list)
    clicks: dict[str, Click] = field(default_factory=dict)  # lower-case click target -> effect, in page order
    searchable: bool = False  # whether ``search[...]`` is valid here (the search page only, as in WebShop)
    examples: tuple[str, ...] = ()

    def add(self, type_: str, text: str, click: str | None = None, effect: Click | None = None) -> None:
        self.elements.append(Element(str(len(self.elements) + 1), type_, text))
        if click is not None and effect is not None:
            self.clicks[click.lower()] = effect

    def admissible_actions(self) -> list[str]:
        return [f"search[{q}]" for q in self.examples] + [f"click[{target}]" for target in self.clicks]


def _button(page: Page, label: str, effect: Click) -> None:
    page.add("button", label, label, effect)


def _money(price: float) -> str:
    return f"${price:.2f}"


def build_page(state: ShopState, catalog: Catalog, results_per_page: int) -> Page:
    """The page of ``state``: its elements, in display order, and its click table."""
    page = Page(state.page, searchable=state.page == "search", examples=state.examples)
    if state.page == "search":
        page.add("searchbox", "search[your query]")
    elif state.page == "results":
        _results(page, state, catalog, results_per_page)
    elif state.page in ("item", "description", "features", "done"):
        assert state.item is not None, f"a {state.page} page needs an item"
        product = catalog.products[state.item]
        if state.page == "item":
            page.add("text", f"{product.asin} — {product.title}")
            page.add("text", f"Price: {_money(product.price)}")
            selected = dict(state.selected)
            for name, values in product.options:
                for value in values:
                    mark = " (selected)" if selected.get(name) == value else ""
                    page.add("option", f"{name}={value}{mark}", value, Click("option", option=(name, value)))
            _button(page, "Description", Click("description"))
            _button(page, "Features", Click("features"))
            _button(page, "Buy Now", Click("buy"))
        elif state.page == "description":
            for sentence in SENTENCE_END.split(product.description):  # one short line per sentence
                page.add("text", sentence)
        elif state.page == "features":
            for feature in product.features:
                page.add("text", feature)
        else:
            chosen = ", ".join(f"{n}={v}" for n, v in state.selected) or "no options"
            page.add("text", f"Thank you for shopping! You bought {product.asin} ({chosen})")
            page.add("text", f"Your score (min 0.0, max 1.0): {state.score:.2f}")
        if state.page != "done":
            _button(page, "< Prev", Click("prev"))
            _button(page, "Back to Search", Click("back_to_search"))
    return page


def after_click(state: ShopState, click: Click) -> ShopState:
    """The state a (non-buy) click leads to: the same in the text shop and on its website (whose links are the
    URLs of these states). Back to Search is a fresh search page (the text shop adds its example queries)."""
    if click.kind == "back_to_search":
        return ShopState("search")
    if click.kind == "next":
        return dataclasses.replace(state, page_no=state.page_no + 1)
    if click.kind == "prev":
        if state.page == "results":
            return dataclasses.replace(state, page_no=state.page_no - 1)
        if state.page == "item":  # back to the results page the item was opened from
            return dataclasses.replace(state, page="results", item=None, selected=())
        return dataclasses.replace(state, page="item")  # from description / features
    if click.kind == "item":
        return dataclasses.replace(state, page="item", item=click.item, selected=())
    if click.kind == "option":
        assert click.option is not None
        selected = dict(state.selected)
        selected[click.option[0]] = click.option[1]
        return dataclasses.replace(state, selected=tuple(selected.items()))
    if click.kind == "description":
        return dataclasses.replace(state, page="description")
    assert click.kind == "features", f"{click.kind}: no page of its own"
    return dataclasses.replace(state, page="features")


def _results(page: Page, state: ShopState, catalog: Catalog, per_page: int) -> None:
    total = len(state.results)
    if total == 0:
        page.add("text", f'No results for "{state.query}"')
        _button(page, "Back to Search", Click("back_to_search"))
        return
    first = (state.page_no - 1) * per_page
    shown = state.results[first : first + per_page]
    page.add("text", f"Page {state.page_no} (results {first + 1}-{first + len(shown)} of {total})")
    _button(page, "Back to Search", Click("back_to_search"))
    if state.page_no > 1:
        _button(page, "< Prev", Click("prev"))
    if first + per_page < total:
        _button(page, "Next >", Click("next"))
    for index in shown:
        product = catalog.products[index]
        page.add("link", f"{product.asin} — {product.title} | {_money(product.price)}", product.asin, Click("item", index))


class ShopStateMapper:
    """Renders a :class:`Page` as the abstract textual state (implements ``dreamgym.envs.base.StateMapper``)."""

    def __call__(self, observation: Any, info: dict[str, Any]) -> str:
        if not isinstance(observation, Page):
            raise TypeError(f"ShopStateMapper renders shop Page objects, got {type(observation).__name__}")
        return format_elements(observation.elements)


# The inverse of the mapper for actions: which clicks an abstract state offers, read from its lines alone
# (the dream env has only the text). Mirrors `build_page`: buttons click by label, links by product id,
# options by value; a searchbox makes `search[...]` valid.

def clicks_in_state(state: str) -> tuple[list[str], bool]:
    """``(click targets in page order, searchable)`` of an abstract shop state."""
    targets: list[str] = []
    searchable = False
    for element in parse_elements(state):
        if not element.id.isdigit():  # the shop numbers its elements
            continue
        kind, text = element.type, element.text
        if kind == "searchbox":
            searchable = True
        elif kind == "button":
            targets.append(text.lower())
        elif kind == "link":
            targets.append(text.split(" — ", 1)[0].strip().lower())
        elif kind == "option" and "=" in text:
            targets.append(text.split("=", 1)[1].removesuffix(" (selected)").strip().lower())
    return list(dict.fromkeys(targets)), searchable


_SEARCH_TYPES = {"searchbox", "search", "textbox", "input"}


def option_step(state: str, action: str, admissible: Sequence[str]) -> bool:
    """Whether ``action`` clicks one of two or more options of ``state`` (the shop's ``EnvSpec.decision_step``):
    the choice the task's words decide, which behaviour cloning shows the policy a few hundred times in the demo's
    budget. An option ``click[v]`` is admissible where the page has a ``name=v`` option element."""
    options = [a for a in admissible if a.startswith("click[") and f"={a[6:-1]}" in state]
    return action in options and len(options) >= 2


def page_type(state: str) -> str:
    """The page kind of a shop state (the shop's ``EnvSpec.page_type``): search, results, item, description,
    features, done or other.

    Rules on the ``[id] type: text`` elements, first match wins (they agree with ``info["page"]`` on the shop's
    own pages, and also classify dreamt states, which have no ``info``):
    done: a text says "thank you" or "your score"; search: a search-box element; results: a product link or
    a "page N (results" / "no results" text; item: an option element or a "buy" button; then, with a "prev"
    or "back" button and text elements: description if every text is a sentence (ends in . ! ?), else
    features (short bullets such as "Slim fit", "Color: red, blue"); otherwise other.
    """
    elements = [(e.type.strip().lower(), e.text.strip().lower()) for e in parse_elements(state)]
    types = [t for t, _ in elements]
    texts = [x for t, x in elements if t == "text"]
    buttons = [x for t, x in elements if t in ("button", "link")]
    if any("thank you" in x or "your score" in x for x in texts):
        return "done"
    if any(t in _SEARCH_TYPES for t in types):
        return "search"
    if "link" in types or any(re.match(r"page \d+ \(results|no results", x) for x in texts):
        return "results"
    if "option" in types or any("buy" in x for x in buttons):
        return "item"
    if texts and any("prev" in x or "back" in x for x in buttons):
        return "description" if all(x.endswith((".", "!", "?")) for x in texts) else "features"
    return "other"
