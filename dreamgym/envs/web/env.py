"""``make("browser", start_url=...)``: real Chromium through Playwright, observed and acted on as BrowserGym does.

* **Observation**: the page's accessibility tree as the abstract state, one ``[bid] role: name`` line per
  element with its value and states (:mod:`dreamgym.envs.web.axtree`).
* **Actions**: ``click[bid]``, ``type[bid][text]`` (fills the field and presses Enter, as WebArena's ``type``
  does by default; ``type[bid][text][0]`` does not press Enter), ``select[bid][option]``, ``go_back`` and
  ``stop[answer]`` (ends the episode with an answer). ``info["admissible_actions"]`` lists the clicks,
  selects, ``go_back`` and, per text field, ``type[bid][text]`` for the text shop's example queries on our shop
  site (``search_examples`` of them, "<attribute> <category>" from the episode's RNG, as the text shop lists
  ``search[...]``) and, with ``offer_instruction=True``, the task's instruction (the policy option
  ``offer_task_search`` of the text shop). Text is free-form: any other text is valid too. A malformed action, a bid not on the page or an action the page
  refuses (not editable, not clickable in time) is an invalid action: the state stays, reward 0,
  ``info["invalid_action"]``, and ``info["last_action_error"]`` says why.
* **Sites**: with ``start_url`` of our shop site (``dreamgym env serve-web shop``; recognised by its
  ``/api/config``) the env plays the text shop's tasks and splits, each episode a site session opened at
  ``/start?task=...``, and the reward is the site's ``/api/result``. Without ``start_url`` the env serves the
  shop site itself, in a background thread on a free port of 127.0.0.1 (``site_kwargs`` are the shop's:
  ``num_products=100`` ...). Any other site plays the tasks of a WebArena-format JSON file (``tasks=``, see
  :mod:`dreamgym.envs.web.webarena`) or one free task at ``start_url``, scored by ``checker(task, answer, page)``
  (a WebArena task's own evaluators by default) when the agent stops or the episode is truncated.
* **Robustness**: all Playwright calls run on one worker thread the env owns (so any thread may call the env),
  each with Playwright's timeout (``timeout_s``) and an outer deadline. A browser that crashed or hangs is
  killed and relaunched (``retries`` times for a reset); a step that loses the browser ends its episode as a
  failure (terminated, reward 0, ``info["browser_error"]``), counted in :attr:`BrowserEnv.stats` and logged.
  ``close()`` closes the context, the browser and Playwright's driver: no chromium process is left.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from dreamgym.envs.base import Element, TextEnv, format_elements, parse_elements
from dreamgym.envs.web.axtree import MARK_BIDS_JS, AXElement, admissible, bid_map, extract, render
from dreamgym.envs.web.site import SITE_NAME, ShopSiteConfig
from dreamgym.types import Task

log = logging.getLogger(__name__)

Checker = Callable[[Task, str, Any], float]  # (task, answer, playwright Page) -> reward in [0, 1]
DEFAULT_MAX_STEPS = 15  # a browser episode's steps (the rule explainer reads it for records without max_steps)
ACTION_RE = re.compile(r"^\s*(click|type|select|stop|go_back|goto)\s*(.*)$", re.IGNORECASE | re.DOTALL)
ARGS_RE = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]")
SESSION_RE = re.compile(r"/s/([0-9a-f]+)/")
_LAUNCH_LOCK = threading.Lock()  # one launch at a time: the new processes of a launch are this env's


class BrowserError(RuntimeError):
    """The browser crashed, hung or could not load a page (after retries)."""


def chromium_executable(path: str | None = None) -> str:
    """The system Chromium (``path``, else ``chromium`` / ``chromium-browser`` on PATH), or a one-line error."""
    for name in ([path] if path else ["chromium", "chromium-browser"]):
        found = shutil.which(name) or (name if Path(name).is_file() else None)
        if found:
            return found
    raise ValueError("browser env: no Chromium found (apt-get install chromium, or pass executable_path=...)")


def parse_browser_action(action: str) -> tuple[str, list[str]] | None:
    """``"type[12][red shirt]"`` -> ``("type", ["12", "red shirt"])``; None when malformed."""
    match = ACTION_RE.match(action)
    if match is None:
        return None
    verb, rest = match.group(1).lower(), match.group(2).strip()
    args = ARGS_RE.findall(rest)
    if ARGS_RE.sub("", rest).strip():
        return None
    need = {"click": (1, 1), "type": (2, 3), "select": (2, 2), "stop": (0, 1), "go_back": (0, 0), "goto": (1, 1)}[verb]
    if not need[0] <= len(args) <= need[1] or (verb != "stop" and any(not a.strip() for a in args[:1])):
        return None
    return verb, [a.strip() if i == 0 else a for i, a in enumerate(args)]


def probe_shop_site(url: str, timeout_s: float) -> ShopSiteConfig | None:
    """Our shop site's config when ``url`` serves one; None for another site; a one-line error when unreachable."""
    try:
        answer = httpx.get(f"{url.rstrip('/')}/api/config", timeout=timeout_s)
    except httpx.HTTPError as e:
        raise ValueError(f"browser env: start_url {url} is unreachable ({type(e).__name__}: {e})") from None
    try:
        body = answer.json() if answer.status_code == 200 else None
    except ValueError:
        body = None
    if not isinstance(body, dict) or body.get("site") != SITE_NAME:
        return None
    return ShopSiteConfig.from_kwargs({k: v for k, v in body.items() if k != "site"})


class BrowserEnv(TextEnv):
    name = "browser"

    def __init__(
        self,
        start_url: str | None = None,
        tasks: str | None = None,
        checker: Checker | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
        timeout_s: float = 10.0,
        action_timeout_s: float = 3.0,
        retries: int = 2,
        headless: bool = True,
        executable_path: str | None = None,
        storage_state: str | None = None,
        url_map: dict[str, str] | None = None,
        viewport: tuple[int, int] = (1280, 720),
        search_examples: int = 3,
        offer_instruction: bool = False,
        **site_kwargs: Any,
    ) -> None:
        super().__init__(max_steps=max_steps)
        if timeout_s <= 0 or action_timeout_s <= 0 or retries < 0:
            raise ValueError("browser env: timeout_s and action_timeout_s must be > 0 and retries >= 0")
        self.executable = chromium_executable(executable_path)
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            raise ValueError("browser env: playwright is not installed (pip install -e .[browser])") from None
        self.timeout_s, self.action_timeout_s, self.retries = timeout_s, action_timeout_s, retries
        self.headless, self.viewport = headless, viewport
        self.storage_state = storage_state
        if storage_state is not None and not Path(storage_state).is_file():
            raise ValueError(f"browser env: storage_state {storage_state}: no such file")
        self.checker = checker
        self.search_examples, self.offer_instruction = search_examples, offer_instruction
        self._examples: list[str] = []
        self.stats = {"episodes": 0, "failed_episodes": 0, "browser_errors": 0, "retries": 0, "invalid_actions": 0,
                      "relaunches": 0}
        self._server: Any = None
        self.shop: ShopSiteConfig | None = None
        if start_url is None and tasks is None:
            from dreamgym.envs.server import BackgroundServer
            from dreamgym.envs.web.site import create_site

            self.shop = ShopSiteConfig.from_kwargs(site_kwargs)
            self._server = BackgroundServer(create_site(self.shop))
            self.start_url = self._server.start()
        else:
            if site_kwargs:
                raise ValueError(f"browser env: {', '.join(sorted(site_kwargs))}: shop arguments go to the site "
                                 "(dreamgym env serve-web shop --env-arg ...), not to an env given a start_url")
            self.start_url = (start_url or "").rstrip("/")
            self.shop = probe_shop_site(self.start_url, timeout_s) if tasks is None else None
        self._web_tasks: dict[str, list[Task]] = {}
        if tasks is not None:
            from dreamgym.envs.web.webarena import load_tasks

            self._web_tasks = load_tasks(tasks, url_map or {})
        self._shop_tasks: dict[str, list[Task]] = {}
        self._http = httpx.Client(timeout=timeout_s)
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dreamgym-browser")
        self._pw: Any = None
        self._browser: Any = None
        self._context: Any = None
        self._page: Any = None
        self._cdp: Any = None
        self._procs: list[Any] = []  # psutil.Process of this env's driver and browser
        self.elements: list[AXElement] = []
        self.url = ""
        self.title = ""
        self.session: str | None = None
        self._history = self._history_base = 0
        self._bids: set[str] = set()
        self._failed: str | None = None
        self.closed = False

    # -- tasks ------------------------------------------------------------------------------------
    def tasks(self, split: str = "train") -> list[Task]:
        if self.shop is not None:
            if split not in self._shop_tasks:
                self._shop_tasks[split] = [t.model_copy(update={"env": self.name}) for t in self.shop.tasks(split)]
            return self._shop_tasks[split]
        return list(self._web_tasks.get(split, []))

    def trajectory_meta(self) -> dict[str, Any]:
        """Recorded in a collected trajectory's meta: the shop site's config (``site``) when the env plays our shop,
        so the rule explainer (:mod:`dreamgym.envs.web.explain`) rebuilds it even for a ``start_url`` env."""
        return {"site": self.shop.to_dict()} if self.shop is not None else {}

    # -- the worker thread --------------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the browser thread; past its deadline the browser is killed (and relaunched later)."""
        if self.closed:
            raise RuntimeError("browser env: closed")
        future = self._worker.submit(fn, *args)
        try:
            return future.result(timeout=self.timeout_s * 3 + 10)
        except concurrent.futures.TimeoutError:
            self._kill()
            raise BrowserError(f"the browser did not answer within {self.timeout_s * 3 + 10:.0f} s") from None

    def _kill(self) -> None:
        """Kill the browser's processes (a hung browser); the worker thread then fails its call and frees up."""
        self._kill_stray()
        self._pw = self._browser = self._context = self._page = self._cdp = None
        old, self._worker = self._worker, concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dreamgym-browser")
        old.shutdown(wait=False)

    def _launch(self) -> None:
        import psutil
        from playwright.sync_api import sync_playwright

        me = psutil.Process()
        with _LAUNCH_LOCK:
            before = {p.pid for p in me.children(recursive=True)}
            self._pw = sync_playwright().start()
            try:
                self._browser = self._pw.chromium.launch(
                    executable_path=self.executable, headless=self.headless, timeout=self.timeout_s * 1000,
                    args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
            finally:
                self._procs = [p for p in me.children(recursive=True) if p.pid not in before]
        self.stats["relaunches"] += 1

    def _shutdown_browser(self) -> None:
        """Close the context, the browser and the driver (on the worker thread); errors of a dead browser ignored."""
        for close in (lambda: self._context and self._context.close(), lambda: self._browser and self._browser.close(),
                      lambda: self._pw and self._pw.stop()):
            try:
                close()
            except Exception as e:  # a crashed browser cannot be closed cleanly; its processes are killed below
                log.debug("browser env: while closing: %s", e)
        self._pw = self._browser = self._context = self._page = self._cdp = None

    def _alive(self) -> bool:
        return self._browser is not None and self._browser.is_connected()

    # -- episodes -----------------------------------------------------------------------------------
    def _reset(self, task: Task | None, split: str) -> tuple[str, dict[str, Any]]:
        if task is None:
            if self.shop is not None:
                raise ValueError("browser env: reset needs a task (none given and the split has none)")
            task = Task(task_id="browse", instruction="", env=self.name, goal={"start_url": self.start_url})
        self.task, self._failed, self.session = task, None, None
        self.stats["episodes"] += 1
        self._examples = self._draw_examples()
        url = self._start_url(task)
        error = ""
        for attempt in range(self.retries + 1):
            try:
                self._call(self._open, url)
                return self._observe_info()
            except Exception as e:  # a crash, a timeout, a page that did not load: retry with a fresh browser
                error = _one_line(e)
                self.stats["browser_errors"] += 1
                if attempt < self.retries:
                    self.stats["retries"] += 1
                    log.warning("browser env: reset of %s failed (%s); retrying", task.task_id, error)
                    self._restart()
        return self._fail(f"could not open {url} after {self.retries + 1} tries: {error}")

    def _draw_examples(self) -> list[str]:
        """The text shop's example queries ("<attribute> <category>", from the episode's RNG) on our shop site."""
        if self.shop is None:
            return []
        from dreamgym.envs.shop.vocab import CATEGORIES

        examples = []
        for _ in range(self.search_examples):
            spec = CATEGORIES[int(self.np_random.integers(len(CATEGORIES)))]
            examples.append(f"{spec.attributes[int(self.np_random.integers(len(spec.attributes)))]} {spec.name}")
        return list(dict.fromkeys(examples))

    def _type_texts(self, instruction: str) -> list[str]:
        return self._examples + ([instruction] if self.offer_instruction and instruction else [])

    def _start_url(self, task: Task) -> str:
        if self.shop is not None:
            return f"{self.start_url}/start?task={task.task_id}&seed={int(self.np_random.integers(1 << 30))}"
        url = str(task.goal.get("start_url") or self.start_url)
        if not url:
            raise ValueError(f"browser env: task {task.task_id} has no start_url and the env has none")
        return url

    def _restart(self) -> None:
        try:
            self._call(self._shutdown_browser)
        except Exception:
            self._kill()
        self._kill_stray(grace_s=2.0)

    def _kill_stray(self, grace_s: float = 0.0) -> None:
        """Wait up to ``grace_s`` for this env's browser processes to exit, then kill the rest (a process is
        known by its pid and start time, so a recycled pid is never touched)."""
        import psutil

        alive = [p for p in self._procs if p.is_running()]
        self._procs = []
        if not alive:
            return
        _, alive = psutil.wait_procs(alive, timeout=grace_s)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _, alive = psutil.wait_procs(alive, timeout=3)
        if alive:
            log.warning("browser env: %d browser processes survived kill", len(alive))

    def _open(self, url: str) -> None:
        if not self._alive():
            self._shutdown_browser()
            self._launch()
        if self._context is not None:
            self._context.close()
        kwargs: dict[str, Any] = {"viewport": {"width": self.viewport[0], "height": self.viewport[1]}}
        storage = (self.task.goal.get("storage_state") if self.task is not None else None) or self.storage_state
        if storage:  # login cookies (a Playwright storage_state file), the task's own or the env's
            kwargs["storage_state"] = storage
        self._context = self._browser.new_context(**kwargs)
        self._context.set_default_timeout(self.action_timeout_s * 1000)
        self._context.set_default_navigation_timeout(self.timeout_s * 1000)
        self._page = self._context.new_page()
        self._cdp = self._context.new_cdp_session(self._page)
        self._page.goto(url, wait_until="load")
        found = SESSION_RE.search(self._page.url)
        self.session = found.group(1) if found and self.shop is not None else None
        self._snapshot()
        self._history_base = self._history

    def _snapshot(self) -> None:
        """Mark bids and read the accessibility tree (on the worker thread)."""
        page = self._page
        if len(self._context.pages) > 1 and self._context.pages[-1] is not page:  # a link opened a new tab
            page = self._page = self._context.pages[-1]
            self._cdp = self._context.new_cdp_session(page)
        self.title = page.evaluate(MARK_BIDS_JS)
        # where the tab is in its history: ``history.length`` does not shrink on go_back, the current index does
        self._history = int(self._cdp.send("Page.getNavigationHistory")["currentIndex"])
        nodes = self._cdp.send("Accessibility.getFullAXTree")["nodes"]
        bids = bid_map(self._cdp.send("DOM.getDocument", {"depth": -1, "pierce": True}))
        self.elements = extract(nodes, bids)
        self._bids = set(bids.values())
        self.url = page.url

    def _observe_info(self) -> tuple[str, dict[str, Any]]:
        obs = render(self.elements, self.title)
        texts = self._type_texts(self.task.instruction if self.task is not None else "")
        actions = admissible(self.elements, texts, self._history > self._history_base)
        return obs, {"admissible_actions": actions, "url": self.url, "invalid_action": False}

    def _fail(self, why: str) -> tuple[str, dict[str, Any]]:
        """The episode fails: logged, counted, an error observation; its next step ends it with reward 0."""
        self._failed = why
        self.stats["failed_episodes"] += 1
        log.warning("browser env: episode %s failed: %s", self.task.task_id if self.task else "?", why)
        self.elements = []
        obs = format_elements([Element("0", "text", f"browser error: {why}")])
        return obs, {"admissible_actions": ["stop[]"], "browser_error": why}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._failed is not None:
            failed: dict[str, Any] = {"browser_error": self._failed, "admissible_actions": []}
            return self._last_obs, 0.0, True, failed
        parsed = parse_browser_action(action)
        if parsed is None:
            return self._invalid(f"malformed action {action!r}")
        verb, args = parsed
        if verb in ("click", "type", "select") and args[0] not in self._bids:
            return self._invalid(f"no element with bid {args[0]!r} on this page")
        if verb == "stop":
            return self._finish(args[0] if args else "", terminated=True)
        try:
            error = self._call(self._act, verb, args)
            if error is None:
                self._call(self._settle)
        except Exception as e:
            return self._crashed(e)
        if error is not None:
            return self._invalid(error)
        if self.shop is not None:
            result = self._shop_result()
            if result.get("done"):
                obs, info = self._observe_info()
                info["success"], info["purchase"] = bool(result["success"]), result.get("purchase", {})
                info["admissible_actions"] = []
                return obs, float(result["reward"]), True, info
        elif self.steps >= self.max_steps:  # truncated: WebArena scores the last page with an empty answer
            return self._finish("", terminated=False)
        obs, info = self._observe_info()
        return obs, 0.0, False, info

    def _act(self, verb: str, args: list[str]) -> str | None:
        """Perform an action on the worker thread; a string says why the page refused it (an invalid action)."""
        from playwright.sync_api import Error as PlaywrightError

        page = self._page
        try:
            if verb == "go_back":
                if self._history <= self._history_base:
                    return "no page to go back to"
                page.go_back(wait_until="load")
            elif verb == "goto":
                page.goto(args[0], wait_until="load")
            else:
                target = page.locator(f'[data-bid="{args[0]}"]').first
                if verb == "click":
                    target.click()
                elif verb == "select":
                    target.select_option(label=args[1])
                else:
                    target.fill(args[1])
                    if len(args) < 3 or args[2].strip() not in ("0", "false"):
                        target.press("Enter")
        except PlaywrightError as e:
            if not self._alive() or "closed" in str(e).lower():
                raise
            return _one_line(e)
        return None

    def _settle(self) -> None:
        """Wait for the page the action led to, then read it; a timeout is retried ``retries`` times."""
        for attempt in range(self.retries + 1):
            try:
                self._page.wait_for_load_state("load", timeout=self.timeout_s * 1000)
                self._snapshot()
                return
            except Exception as e:
                if not self._alive() or attempt == self.retries:
                    raise
                self.stats["retries"] += 1
                log.warning("browser env: reading the page failed (%s); retrying", _one_line(e))

    def _shop_result(self) -> dict[str, Any]:
        try:
            answer = self._http.get(f"{self.start_url}/api/result", params={"session": self.session or ""})
            body = answer.json()
        except (httpx.HTTPError, ValueError) as e:
            self.stats["browser_errors"] += 1
            log.warning("browser env: the site's /api/result failed: %s", _one_line(e))
            return {}
        return body if isinstance(body, dict) else {}

    def _finish(self, answer: str, terminated: bool) -> tuple[str, float, bool, dict[str, Any]]:
        """``stop[answer]`` or truncation: the shop's result, or the task's checker on the final page."""
        assert self.task is not None
        reward, success = 0.0, False
        info: dict[str, Any] = {"answer": answer, "admissible_actions": []}
        if self.shop is not None:
            result = self._shop_result()
            reward, success = float(result.get("reward", 0.0)), bool(result.get("success", False))
        else:
            checker = self.checker or self._task_checker()
            if checker is not None:
                try:
                    reward = float(self._call(checker, self.task, answer, self._page))
                except Exception as e:
                    self.stats["browser_errors"] += 1
                    log.warning("browser env: the checker of %s failed: %s", self.task.task_id, _one_line(e))
                    info["checker_error"] = _one_line(e)
                success = reward >= 1.0
        obs, _ = self._observe_info()
        info["success"] = success
        return obs, reward, terminated, info

    def _task_checker(self) -> Checker | None:
        assert self.task is not None
        if "eval" not in self.task.goal:
            return None
        from dreamgym.envs.web.webarena import evaluate_task

        return evaluate_task

    def _invalid(self, why: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.stats["invalid_actions"] += 1
        _, info = self._observe_info()
        info.update(invalid_action=True, last_action_error=why)
        return self._last_obs, 0.0, False, info

    def _crashed(self, e: BaseException) -> tuple[str, float, bool, dict[str, Any]]:
        self.stats["browser_errors"] += 1
        self._restart()
        obs, info = self._fail(f"the browser failed mid-episode: {_one_line(e)}")
        info["admissible_actions"] = []
        return obs, 0.0, True, info

    # -- the action grammar of abstract states (the dream env asks the real env) --------------------
    def admissible_for_state(self, state: str) -> list[str]:
        """The actions of an abstract browser state read from its lines alone: ``click`` per clickable role,
        ``select`` per listed option, ``type[bid][text]`` per text field with example queries (the shop's) and,
        with ``offer_instruction``, the page's ``Instruction: ...`` text (the shop site shows the task's)."""
        lines = parse_elements(state)
        shown = [e.text.removeprefix("Instruction: ") for e in lines
                 if e.type == "text" and e.text.startswith("Instruction: ")]
        texts = self._draw_examples() + (shown[:1] if self.offer_instruction else [])
        return admissible([_element_of(e) for e in lines], texts, can_go_back=False)

    def action_valid_for_state(self, state: str, action: str) -> bool:
        parsed = parse_browser_action(action)
        if parsed is None:
            return False
        verb, args = parsed
        if verb in ("go_back", "stop", "goto"):
            return True
        elements = {e.id: _element_of(e) for e in parse_elements(state)}
        element = elements.get(args[0])
        if element is None:
            return False
        if verb == "click":
            return element.clickable
        if verb == "type":
            return element.editable
        return args[1] in element.options

    # -- extras -------------------------------------------------------------------------------------
    def screenshot(self, path: str | Path | None = None, full_page: bool = False) -> bytes:
        """A PNG of the current page (also written to ``path`` when given)."""
        if self._page is None:
            raise RuntimeError("browser env: no page yet (call reset first)")
        png: bytes = self._call(lambda: self._page.screenshot(full_page=full_page, timeout=self.timeout_s * 1000))
        if path is not None:
            Path(path).write_bytes(png)
        return png

    def close(self) -> None:
        """Close the context, the browser, Playwright's driver and the env's own site; idempotent."""
        if self.closed:
            return
        try:
            self._call(self._shutdown_browser)
        except Exception as e:
            log.warning("browser env: closing the browser failed (%s); killing it", _one_line(e))
        self._kill_stray(grace_s=5.0)
        self.closed = True
        self._worker.shutdown(wait=True)
        self._http.close()
        if self._server is not None:
            self._server.stop()
            self._server = None
        super().close()

    def __del__(self) -> None:  # best effort: a forgotten env must not leave a browser behind
        try:
            if not getattr(self, "closed", True):
                self.close()
        except Exception:
            pass


def _element_of(line: Element) -> AXElement:
    """The :class:`AXElement` an observation line describes (its role, options and, roughly, its name)."""
    text, _, options = line.text.partition(" options: ")
    return AXElement(line.id, line.type, text, options=tuple(options.split(" | ")) if options else ())


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()
