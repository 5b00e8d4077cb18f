"""The built-in shop served as a real website (FastAPI, plain HTML): ``dreamgym env serve-web shop``.

Same catalog, BM25 search, pages, tasks and purchase reward as the text shop: every page is the shop's own
:func:`~dreamgym.envs.shop.pages.build_page` of a :class:`~dreamgym.envs.shop.pages.ShopState`, rendered as
HTML with a link (or a form) for each of its clicks, and a purchase is scored by the shop's
:func:`~dreamgym.envs.shop.reward.purchase_reward`. As on WebShop's own site, everything but the task lives in
the URL (so the browser's back button is always consistent, and :func:`state_from_url` reads a page's state back):

* ``GET /start?task=<task id>[&seed=N]`` -> a new session, redirected to ``/s/<session>/search``
* ``GET /s/<session>/search``: a search form (a searchbox and a Search button) and the instruction
* ``GET /s/<session>/results?q=..&p=N``: the page's text, Back to Search, < Prev / Next > and one link per product
* ``GET /s/<session>/item/<asin>?q=..&p=N&o=name:value...``: options as ``role=radio`` links (the selected one
  ``aria-checked``), Description, Features, < Prev, Back to Search, and a Buy Now form button
* ``GET .../item/<asin>/description`` and ``/features``; ``POST /s/<session>/buy`` scores the purchase once and
  redirects to ``/s/<session>/done``
* ``GET /api/result?session=..`` -> ``{"done", "reward", "success", "purchase", "task_id"}``;
  ``GET /api/config`` -> the shop's constructor arguments (a browser env recognises our site by it)

Sessions live in the server's memory (a single worker), at most ``max_sessions`` (the oldest go first).
"""

from __future__ import annotations

import html
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from dreamgym.envs.base import Element
from dreamgym.envs.shop.catalog import Catalog, build_catalog
from dreamgym.envs.shop.pages import Click, Page, ShopState, after_click, build_page
from dreamgym.envs.shop.reward import ShopGoal, purchase_reward
from dreamgym.envs.shop.search import SearchEngine, search_engine
from dreamgym.envs.shop.tasks import build_tasks, split_targets
from dreamgym.types import Task

SITE_NAME = "dreamgym-shop"
DEFAULT_MAX_SESSIONS = 10_000
MAX_FORM_BYTES = 1 << 14


@dataclass(frozen=True)
class ShopSiteConfig:
    """The text shop's constructor arguments that decide what the site shows and which tasks it knows."""

    num_products: int = 1000
    catalog_seed: int = 0
    num_tasks_per_split: int = 2000
    results_per_page: int = 5
    max_results: int = 50
    test_fraction: float = 0.2
    val_fraction: float = 0.0
    num_val_tasks: int = 500

    def __post_init__(self) -> None:
        for key in ("num_products", "num_tasks_per_split", "results_per_page", "max_results", "num_val_tasks"):
            if getattr(self, key) < 1:
                raise ValueError(f"shop site: {key} must be >= 1, got {getattr(self, key)}")
        split_targets(self.num_products, self.catalog_seed, self.test_fraction, self.val_fraction)

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> ShopSiteConfig:
        unknown = set(kwargs) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"shop site: unknown argument(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(cls.__dataclass_fields__)}")
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def tasks(self, split: str) -> list[Task]:
        """The text shop's tasks of ``split`` (the same ids, instructions and goals)."""
        num = self.num_val_tasks if split == "val" else self.num_tasks_per_split
        return list(build_tasks(self.num_products, self.catalog_seed, split, num, self.test_fraction,
                                self.val_fraction))


@dataclass
class SiteSession:
    task: Task
    goal: ShopGoal
    seed: int = 0
    done: bool = False
    reward: float = 0.0
    success: bool = False
    purchase: dict[str, Any] = field(default_factory=dict)

    def result(self) -> dict[str, Any]:
        return {"task_id": self.task.task_id, "done": self.done, "reward": self.reward, "success": self.success,
                "purchase": self.purchase}


# ------------------------------------------------------------------------------------ URLs <-> states

def _query(state: ShopState, **extra: Any) -> str:
    pairs: list[tuple[str, Any]] = [("q", state.query), ("p", state.page_no)]
    pairs += [("o", f"{n}:{v}") for n, v in state.selected]
    pairs += list(extra.items())
    return urlencode(pairs)


def state_url(sid: str, state: ShopState, catalog: Catalog) -> str:
    """The path (with query) that shows ``state`` in session ``sid``."""
    base = f"/s/{sid}"
    if state.page == "search":
        return f"{base}/search"
    if state.page == "results":
        return f"{base}/results?{urlencode([('q', state.query), ('p', state.page_no)])}"
    if state.page == "done":
        return f"{base}/done"
    assert state.item is not None
    asin = catalog.products[state.item].asin
    tail = "" if state.page == "item" else f"/{state.page}"
    return f"{base}/item/{asin}{tail}?{_query(state)}"


def state_from_url(url: str, catalog: Catalog, engine: SearchEngine, max_results: int) -> tuple[str, ShopState] | None:
    """``(session id, ShopState)`` of a site URL, or None when the URL is not a shop page."""
    parts = urlsplit(url)
    path = [p for p in parts.path.split("/") if p]
    if len(path) < 3 or path[0] != "s":
        return None
    sid, kind, rest = path[1], path[2], path[3:]
    params = parse_qs(parts.query)
    query = " ".join(params.get("q", [""])[0].split())
    try:
        page_no = max(1, int(params.get("p", ["1"])[0]))
    except ValueError:
        page_no = 1
    if kind == "search":
        return sid, ShopState("search")
    if kind == "done":
        return sid, ShopState("done")
    results = tuple(engine.search(query, max_results)) if query else ()
    if kind == "results" and not rest:
        return sid, ShopState("results", query=query, results=results, page_no=page_no)
    if kind != "item" or not rest:
        return None
    try:
        item = catalog.index_of(rest[0])
    except KeyError:
        return None
    page = {"": "item", "description": "description", "features": "features"}.get(rest[1] if len(rest) > 1 else "")
    if page is None:
        return None
    product = catalog.products[item]
    selected: dict[str, str] = {}
    for pair in params.get("o", []):
        name, _, value = pair.partition(":")
        if value in product.option_values(name):
            selected[name] = value
    return sid, ShopState(page, query=query, results=results, page_no=page_no, item=item,  # type: ignore[arg-type]
                          selected=tuple(selected.items()))


# ------------------------------------------------------------------------------------------ rendering

def click_target(element: Element) -> str:
    """The click target of an element, as the text shop keys its clicks (see ``pages.clicks_in_state``)."""
    if element.type == "link":
        return element.text.split(" — ", 1)[0].strip().lower()
    if element.type == "option":
        return element.text.split("=", 1)[1].removesuffix(" (selected)").strip().lower()
    return element.text.lower()


def _href(sid: str, state: ShopState, click: Click, catalog: Catalog) -> str:
    return state_url(sid, after_click(state, click), catalog)


_STYLE = ("body{font-family:sans-serif;max-width:50em;margin:1em auto}a{margin-right:.6em}"
          "[role=radio][aria-checked=true]{font-weight:bold;text-decoration:none}")


PAGE_TITLES = {"search": "Search", "results": "Results", "item": "Item", "description": "Description",
               "features": "Features", "done": "Thank you"}


def page_title(kind: str) -> str:
    """The document title of a page kind (the browser's observation starts with ``Page: <title>``)."""
    return f"Shop — {PAGE_TITLES[kind]}"


def _document(title: str, body: list[str]) -> str:
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><main>{''.join(body)}</main></body></html>")


def render_page(sid: str, state: ShopState, page: Page, catalog: Catalog, instruction: str) -> str:
    """The HTML of a shop page: the text shop's elements in order, each click a link or a form."""
    esc = html.escape
    body: list[str] = []
    group: str | None = None  # the option radiogroup being written
    for element in page.elements:
        if element.type != "option" and group is not None:
            body.append("</div>")
            group = None
        if element.type == "searchbox":
            body.append(f"<p>Instruction: {esc(instruction)}</p>"
                        f"<form role='search' method='get' action='/s/{sid}/results'>"
                        "<input type='search' name='q' aria-label='Search' autofocus>"
                        "<button type='submit'>Search</button></form>")
            continue
        if element.type == "text":
            tag = "h1" if state.page == "item" and not body else "p"
            body.append(f"<{tag}>{esc(element.text)}</{tag}>")
            continue
        click = page.clicks[click_target(element)]
        if click.kind == "buy":
            hidden = "".join(f"<input type='hidden' name='o' value='{esc(f'{n}:{v}', quote=True)}'>"
                             for n, v in state.selected)
            asin = catalog.products[state.item].asin if state.item is not None else ""
            body.append(f"<form method='post' action='/s/{sid}/buy'><input type='hidden' name='asin' value='{asin}'>"
                        f"{hidden}<button type='submit'>{esc(element.text)}</button></form>")
            continue
        href = esc(_href(sid, state, click, catalog), quote=True)
        if element.type == "option":
            assert click.option is not None
            name, value = click.option
            if group != name:
                if group is not None:
                    body.append("</div>")
                label = f"opt-{len(body)}"
                body.append(f"<div role='radiogroup' aria-labelledby='{label}'><span id='{label}'>{esc(name)}</span> ")
                group = name
            checked = "true" if dict(state.selected).get(name) == value else "false"
            body.append(f"<a role='radio' aria-checked='{checked}' href='{href}'>{esc(value)}</a>")
            continue
        if element.type == "link":
            body.append(f"<p><a href='{href}'>{esc(element.text)}</a></p>")
        else:
            body.append(f"<a href='{href}'>{esc(element.text)}</a>")
    if group is not None:
        body.append("</div>")
    return _document(page_title(state.page), body)


# ------------------------------------------------------------------------------------------------ app

class ShopSite:
    """The site's state: the catalog, the search engine, the task table and the sessions."""

    def __init__(self, config: ShopSiteConfig, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self.config = config
        self.catalog = build_catalog(config.num_products, config.catalog_seed)
        self.engine = search_engine(config.num_products, config.catalog_seed)
        splits = ("train", "test", "val") if config.val_fraction > 0 else ("train", "test")
        self.tasks: dict[str, Task] = {t.task_id: t for s in splits for t in config.tasks(s)}
        self.sessions: OrderedDict[str, SiteSession] = OrderedDict()
        self.max_sessions = max_sessions
        self.lock = threading.Lock()

    def start(self, task_id: str, seed: int) -> str:
        task = self.tasks[task_id]
        sid = secrets.token_hex(8)
        with self.lock:
            self.sessions[sid] = SiteSession(task, ShopGoal.from_dict(task.goal, task.task_id), seed)
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        return sid

    def session(self, sid: str) -> SiteSession | None:
        with self.lock:
            return self.sessions.get(sid)

    def buy(self, sid: str, asin: str, options: list[str]) -> bool:
        """Score a purchase once; False when the session is unknown, already done or the product is unknown."""
        session = self.session(sid)
        if session is None or session.done:
            return False
        try:
            product = self.catalog.get(asin)
        except KeyError:
            return False
        selected = {}
        for pair in options:
            name, _, value = pair.partition(":")
            if value in product.option_values(name):
                selected[name] = value
        breakdown = purchase_reward(session.goal, product, selected)
        session.done, session.reward, session.success = True, breakdown.total, breakdown.success
        session.purchase = {"asin": product.asin, "options": selected, **breakdown.to_dict()}
        return True


def _error_page(status: int, text: str) -> HTMLResponse:
    return HTMLResponse(_document("Error", [f"<p>{html.escape(text)}</p>"]), status_code=status)


def create_site(config: ShopSiteConfig | None = None, max_sessions: int = DEFAULT_MAX_SESSIONS) -> FastAPI:
    """The FastAPI app of the shop site (``app.state.site`` holds its :class:`ShopSite`)."""
    site = ShopSite(config or ShopSiteConfig(), max_sessions=max_sessions)
    app = FastAPI(title="dreamgym shop site", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.site = site

    @app.get("/")
    def index() -> HTMLResponse:
        return HTMLResponse(_document("Shop", ["<p>Start an episode at /start?task=TASK_ID</p>"]))

    @app.get("/start")
    def start(task: str = "", seed: int = 0) -> Response:
        if task not in site.tasks:
            return _error_page(404, f"unknown task {task!r}")
        return RedirectResponse(f"/s/{site.start(task, seed)}/search", status_code=303)

    @app.get("/api/config")
    def api_config() -> dict[str, Any]:
        return {"site": SITE_NAME, **site.config.to_dict()}

    @app.get("/api/result")
    def api_result(session: str = "") -> JSONResponse:
        found = site.session(session)
        if found is None:
            return JSONResponse({"error": f"unknown session {session!r}"}, status_code=404)
        return JSONResponse(found.result())

    @app.post("/s/{sid}/buy")
    async def buy(sid: str, request: Request) -> Response:
        if site.session(sid) is None:
            return _error_page(404, "unknown session")
        body = await request.body()  # an urlencoded form (parsed here: no python-multipart needed)
        form = parse_qs(body[:MAX_FORM_BYTES].decode("utf-8", errors="replace"))
        # a second purchase in a session is ignored: the first one counts
        site.buy(sid, form.get("asin", [""])[0], form.get("o", []))
        return RedirectResponse(f"/s/{sid}/done", status_code=303)

    @app.get("/s/{sid}/{rest:path}")
    def page(sid: str, rest: str, request: Request) -> HTMLResponse:
        session = site.session(sid)
        if session is None:
            return _error_page(404, "unknown session (start one at /start?task=TASK_ID)")
        parsed = state_from_url(str(request.url), site.catalog, site.engine, site.config.max_results)
        if parsed is None:
            return _error_page(404, "no such page")
        state = parsed[1]
        if state.page == "done":
            if not session.done:
                return _error_page(404, "nothing bought yet")
            purchase = session.purchase
            state = ShopState("done", item=site.catalog.index_of(purchase["asin"]),
                              selected=tuple(purchase["options"].items()), score=session.reward)
        page = build_page(state, site.catalog, site.config.results_per_page)
        return HTMLResponse(render_page(sid, state, page, site.catalog, session.task.instruction))

    return app
