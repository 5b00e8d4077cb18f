"""The browser shop's rule-based annotator: a reasoning trace per browser step on the built-in shop site, from the
shop's own ground truth (its catalog, search engine, pages and purchase reward).

The traces are the text shop's (:mod:`dreamgym.envs.shop.explain`: one line per step, copies of values shown in
the task or the page and single comparisons, ending with ``-> <where the action leads>``), naming the element
by its browser id (bid)::

    search [5] "cotton bed sheets" -> results page 1, 1-5 of 11
    open [7] B0N38ATR "Torzu Cotton Bed Sheets, Breathable" $42.37 -> item page
    select [8] flavor=hazelnut on B0QD24ZQ -> item page, flavor=hazelnut selected
    next [5] on results page 1 -> results page 2, 6-10 of 11
    back to search [19] -> search page
    buy [18] B0LF9NDA; type t-shirt=t-shirt y; attr machine washable title y; opt size=s sel y; \
price 38.46<=50.00 y; score 3/3=1.00 -> done
    go_back -> results page 1, 1-5 of 24
    click [3] on text "Page 1 (results 1-5 of 24)" -> nothing to click, page unchanged
    type [5] "coffee" without Enter -> search page, query not sent
    stop "B0QD24ZQ" -> episode ends, nothing bought, reward 0
    invalid: click[99]: no element [99] on this page -> state unchanged, reward 0

Ground truth: the site keeps a page's whole state in its URL (:mod:`dreamgym.envs.web.site`), so the explainer
follows the episode as a :class:`~dreamgym.envs.shop.pages.ShopState`, rebuilding the shop from the record
(``meta["site"]``, else the shop arguments in ``meta["env_kwargs"]``). Each step maps the recorded action to
the shop's (the bid's line in the recorded state is a known element of the page), moves the state as the site
does (a browser history of states for ``go_back``), and checks that the page the browser showed, the lines of
``next_state`` without their bids, is the shop's page of the new state, that the step's URL
(``info["url"]``, recorded by collect) reads back as that state, and that a purchase's reward is the recorded
one. A step that fails a check (another site, a tampered record, a page the model cannot predict) gets a plain
trace from the recorded text and is counted (``replay_mismatch``, ``reward_mismatch``, ``text_only_steps``;
``unknown_site`` for a record not from our shop), logged; a later step's URL puts the replay back in sync
(``url_resync``). Nothing raises: a record is never explained from a guess.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from dreamgym.envs.shop.catalog import Catalog, build_catalog
from dreamgym.envs.shop.explain import (
    INVALID_OUTCOME,
    click_trace,
    purchase_trace,
    results_summary,
    short,
    task_tutorial,
    text_only_trace,
)
from dreamgym.envs.shop.pages import ShopState, after_click, build_page
from dreamgym.envs.shop.reward import ShopGoal
from dreamgym.envs.shop.search import SearchEngine, search_engine
from dreamgym.envs.web.axtree import AXElement
from dreamgym.envs.web.env import DEFAULT_MAX_STEPS, parse_browser_action
from dreamgym.envs.web.site import ShopSiteConfig, click_target, page_title, state_from_url
from dreamgym.types import Explanation, Trajectory, Transition

log = logging.getLogger(__name__)

BID_RE = re.compile(r"^\[([^\]]*)\] ")
VALUE_RE = re.compile(r' value="(.*)"$')
SEARCH, SUBMIT = "\0search", "\0submit"  # the search page's box and button (no shop click of their own)


@dataclass(frozen=True)
class Line:
    """One line of a browser page, without its bid: ``role: name``, and the shop click it makes (None: none)."""

    text: str
    target: str | None = None


@dataclass(frozen=True)
class SiteModel:
    """The shop behind the site: what its pages show and where their links lead."""

    config: ShopSiteConfig
    catalog: Catalog
    engine: SearchEngine

    def results(self, query: str) -> ShopState:
        query = " ".join(query.split())
        found = tuple(self.engine.search(query, self.config.max_results)) if query else ()
        return ShopState("results", query=query, results=found)

    def where(self, state: ShopState) -> str:
        """Where a state is, as a trace's ``-> ...`` says it."""
        if state.page in ("search", "done"):
            return f"{state.page} page"
        if state.page == "results":
            return results_summary(state, self.config.results_per_page)
        assert state.item is not None
        asin = self.catalog.products[state.item].asin
        if state.page != "item":
            return f"{state.page} page of {asin}"
        return f"item page {asin}" + "".join(f", {n}={v} selected" for n, v in state.selected)

    def lines(self, state: ShopState, instruction: str) -> list[Line]:
        """The browser's lines of the site's page of ``state`` (as :func:`~dreamgym.envs.web.site.render_page`
        writes it and the accessibility tree reads it), each with its click target."""
        out = [Line(f"Page: {page_title(state.page)}")]
        if state.page == "search":
            return [*out, Line(_ax("text", f"Instruction: {instruction}")), Line(_ax("searchbox", "Search"), SEARCH),
                    Line(_ax("button", "Search"), SUBMIT)]
        page = build_page(state, self.catalog, self.config.results_per_page)
        group: str | None = None
        for i, element in enumerate(page.elements):
            if element.type != "option":
                group = None
            if element.type == "text":
                out.append(Line(_ax("heading" if state.page == "item" and i == 0 else "text", element.text)))
                continue
            target = click_target(element)
            click = page.clicks[target]
            if click.kind == "option":
                assert click.option is not None
                name, value = click.option
                if group != name:
                    out.append(Line(_ax("radiogroup", name)))
                    group = name
                checked = ("checked",) if dict(state.selected).get(name) == value else ()
                out.append(Line(_ax("radio", value, checked), target))
            else:
                out.append(Line(_ax("button" if click.kind == "buy" else "link", element.text), target))
        return out


def _ax(role: str, name: str, states: tuple[str, ...] = ()) -> str:
    return BID_RE.sub("", AXElement("0", role, " ".join(name.split()), states=states).render(), count=1)


def _recorded(state: str) -> tuple[list[str], dict[str, int], str]:
    """A recorded page's lines without bids (and without a search box's value), each bid's line, the box's value."""
    lines: list[str] = []
    at: dict[str, int] = {}
    value = ""
    for i, line in enumerate(state.splitlines()):
        found = BID_RE.match(line)
        text = line[found.end():] if found else line
        if text.startswith("searchbox: ") and (typed := VALUE_RE.search(text)):
            value, text = typed.group(1), text[: typed.start()]
        if found:
            at.setdefault(found.group(1), i)
        lines.append(text)
    return lines, at, value


# ------------------------------------------------------------------------------------------ the site


def site_model(traj: Trajectory) -> SiteModel | None:
    """The shop site the trajectory was recorded on, or None when the record does not say it is ours."""
    site = traj.meta.get("site")
    kwargs = traj.meta.get("env_kwargs") or {}
    if not isinstance(site, dict):
        if not isinstance(kwargs, dict) or kwargs.get("start_url") or kwargs.get("tasks"):
            return None  # another site, or ours behind a start_url without the config recorded
        site = {k: v for k, v in kwargs.items() if k in ShopSiteConfig.__dataclass_fields__}
    try:
        config = ShopSiteConfig.from_kwargs(site)
        # build_catalog and search_engine are cached by their arguments: a file of episodes builds them once
        return SiteModel(config, build_catalog(config.num_products, config.catalog_seed),
                         search_engine(config.num_products, config.catalog_seed))
    except (TypeError, ValueError) as e:
        log.warning("trajectory %s: cannot rebuild the shop site from %s: %s", traj.traj_id, site, e)
        return None


# ------------------------------------------------------------------------------------------ one step


class Replay:
    """The episode as the site's states: the page the browser is on and its history (for ``go_back``)."""

    def __init__(self, model: SiteModel, goal: ShopGoal, instruction: str, issues: Counter[str]) -> None:
        self.model, self.goal, self.instruction, self.issues = model, goal, instruction, issues
        self.history: list[ShopState] = []

    def shows(self, state: ShopState, page: str) -> bool:
        return [line.text for line in self.model.lines(state, self.instruction)] == _recorded(page)[0]

    def step(self, x: Transition) -> str | None:
        """The trace of one recorded step from the current state; None if the shop's page, URL or reward
        differs from the record. Moves the state on success."""
        before = self.history[-1]
        moved = self._move(before, x)
        if moved is None:
            return None
        trace, after, reward = moved
        if abs(reward - x.reward) > 1e-6:
            self.issues["reward_mismatch"] += 1
            log.warning("shop site reward %.4f differs from the recorded %.4f for %r", reward, x.reward, x.action)
            return None
        if not self.shows(after, x.next_state) or not self._url_agrees(after, x):
            return None
        if after == before:
            pass  # the same page (a same-URL navigation replaces its history entry)
        elif trace.startswith("go_back"):
            self.history.pop()
        else:
            self.history.append(after)
        return trace

    def _url_agrees(self, after: ShopState, x: Transition) -> bool:
        url = x.info.get("url")
        if not isinstance(url, str):
            return True  # a record without URLs (collected before they were kept): the page check alone
        parsed = state_from_url(url, self.model.catalog, self.model.engine, self.model.config.max_results)
        return parsed is not None and (parsed[1] == after or parsed[1].page == after.page == "done")

    def _move(self, before: ShopState, x: Transition) -> tuple[str, ShopState, float] | None:
        """``(trace, state after, reward)`` of the recorded action on ``before``; None when not predictable."""
        lines = self.model.lines(before, self.instruction)
        _, at, typed = _recorded(x.state)
        parsed = parse_browser_action(x.action)
        if x.info.get("invalid_action"):
            return f"invalid: {self._why_invalid(x.action, lines, at)} {INVALID_OUTCOME}", before, 0.0
        if parsed is None:
            return None
        verb, args = parsed
        if verb == "stop":
            answer = f' "{short(args[0])}"' if args and args[0] else ""
            return f"stop{answer} -> episode ends, nothing bought, reward 0", before, 0.0
        if verb == "go_back":
            if len(self.history) < 2:
                return None
            after = self.history[-2]
            return f"go_back -> {self.model.where(after)}", after, 0.0
        index = at.get(args[0])
        if verb == "goto" or index is None or index >= len(lines):
            return None
        line = lines[index]
        if verb == "type" and line.target == SEARCH:
            query = " ".join(args[1].split())
            if len(args) > 2 and args[2].strip() in ("0", "false"):
                return f'type [{args[0]}] "{short(query)}" without Enter -> search page, query not sent', before, 0.0
            after = self.model.results(query)
            return f'search [{args[0]}] "{short(query)}" -> {self.model.where(after)}', after, 0.0
        if verb != "click":
            return None
        if line.target == SUBMIT:  # the Search button sends what the box holds (a form the browser restored)
            after = self.model.results(typed)
            return f'search [{args[0]}] "{short(typed)}" -> {self.model.where(after)}', after, 0.0
        if line.target is None or line.target == SEARCH:
            role, _, name = line.text.partition(": ")
            return f'click [{args[0]}] on {role} "{short(name)}" -> nothing to click, page unchanged', before, 0.0
        page = build_page(before, self.model.catalog, self.model.config.results_per_page)
        click = page.clicks[line.target]
        if click.kind == "buy":
            assert before.item is not None
            product = self.model.catalog.products[before.item]
            selected = dict(before.selected)
            trace, score = purchase_trace(self.goal, product, selected, f" [{args[0]}]")
            return trace, ShopState("done", item=before.item, selected=before.selected, score=score), score
        after = after_click(before, click)
        trace = click_trace(self.model.catalog, self.model.config.results_per_page, self.goal, before, after, click,
                            lambda _: args[0], name_all=True)
        return trace, after, 0.0

    @staticmethod
    def _why_invalid(action: str, lines: list[Line], at: dict[str, int]) -> str:
        parsed = parse_browser_action(action)
        if parsed is None:
            return f'"{short(action)}" is not click[bid], type[bid][text], select[bid][option], go_back or stop[answer]'
        verb, args = parsed
        if verb == "go_back":
            return "go_back: no page to go back to"
        index = at.get(args[0]) if args else None
        if index is None or index >= len(lines):
            return f"{verb}[{short(args[0]) if args else ''}]: no element [{short(args[0]) if args else ''}] on this page"
        role = lines[index].text.partition(": ")[0]
        if verb == "type":
            return f"type[{args[0]}]: [{args[0]}] {role} is not a text field"
        if verb == "select":
            return f"select[{args[0]}]: [{args[0]}] {role} is not a select"
        return f"{verb}[{args[0]}]: the page refused it"


# ------------------------------------------------------------------------------------------ trajectories


def explain_trajectory(traj: Trajectory) -> Explanation:
    """One trace per transition, the shop's task tutorial, and counted issues (see the module docstring)."""
    issues: Counter[str] = Counter()
    model = site_model(traj)
    goal: ShopGoal | None = None
    try:
        goal = ShopGoal.from_dict(traj.task.goal, traj.task.task_id)
    except (ValueError, TypeError, KeyError) as e:
        log.warning("trajectory %s: not a shop task (%s)", traj.traj_id, str(e).splitlines()[0] if str(e) else e)
    if model is None or goal is None:
        issues["unknown_site"] += 1
        issues["text_only_steps"] += len(traj.transitions)
        log.warning("trajectory %s: not recorded on the built-in shop site; plain traces", traj.traj_id)
        return Explanation([text_only_trace(x) for x in traj.transitions], None, issues)
    replay = Replay(model, goal, traj.task.instruction, issues)
    in_sync = bool(traj.transitions) and replay.shows(ShopState("search"), traj.transitions[0].state)
    if in_sync:
        replay.history = [ShopState("search")]
    traces: list[str] = []
    for t, x in enumerate(traj.transitions):
        trace = _safe_step(replay, x) if in_sync else None
        if trace is None:
            if in_sync or t == 0:
                issues["replay_mismatch"] += 1
                log.warning("trajectory %s: the shop site's replay differs from the record at step %d",
                            traj.traj_id, t)
            issues["text_only_steps"] += 1
            trace = text_only_trace(x)
            in_sync = _resync(replay, x)
            if in_sync:
                issues["url_resync"] += 1
        traces.append(trace)
    max_steps = (traj.meta.get("env_kwargs") or {}).get("max_steps", DEFAULT_MAX_STEPS)
    return Explanation(traces, task_tutorial(goal, int(max_steps)), issues)


def _safe_step(replay: Replay, x: Transition) -> str | None:
    try:
        return replay.step(x)
    except (KeyError, IndexError, ValueError, AssertionError) as e:  # a record the shop cannot have made
        log.warning("shop site replay of %r failed: %s", x.action, e)
        return None


def _resync(replay: Replay, x: Transition) -> bool:
    """Back in step from the recorded URL of the step's page, when it reads back as the page shown."""
    url: Any = x.info.get("url")
    if not isinstance(url, str) or x.done:
        return False
    parsed = state_from_url(url, replay.model.catalog, replay.model.engine, replay.model.config.max_results)
    if parsed is None or parsed[1].page == "done" or not replay.shows(parsed[1], x.next_state):
        return False
    replay.history = [parsed[1]]  # the browser's earlier history is not known: a go_back falls back
    return True

