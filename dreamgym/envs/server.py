"""Serve any registered dreamgym env over AgentGym's env-server HTTP protocol (FastAPI + uvicorn).

AgentGym (github.com/WooooDyy/AgentGym) runs each environment as an HTTP server holding many env instances;
its clients (``agentenv.envs.*EnvClient``) create one, reset it to a task index and step it with text actions.
Its servers speak two dialects, and this server speaks both:

* the **id dialect** (agentenv-alfworld, -sciworld, -babyai, -textcraft), at ``/``:

  - ``POST /create`` -> ``{"id": n, "env_idx": n, "observation": ""}``
  - ``POST /reset {id, data_idx}`` (ALFWorld sends ``game``, WebShop ``session_id``; ours may also send
    ``task_id``, ``seed``, ``split``) -> ``{"observation", "task_description", "available_actions",
    "reward": 0, "score": 0, "done": false, "info"}``
  - ``POST /step {id, action}`` -> ``{"observation", "state", "reward", "score", "done",
    "available_actions", "info"}``
  - ``GET /observation?id=`` -> the observation (a string); ``GET /available_actions?id=`` -> a list of
    action strings; ``GET /detail?id=`` -> the last answer
  - ``POST /close {id}`` -> ``{"closed": true}``
  - ours only: ``GET /health``, ``GET /list_envs``, ``GET /tasks`` (the task indices and instructions)

* the **WebShop dialect** (agentenv-webshop), at ``/webshop``: ``POST /create`` answers a bare integer,
  ``POST /reset {env_idx, session_id}`` answers ``[observation, null]``, ``GET /available_actions`` answers
  ``{"has_search_bar", "clickables"}``, plus ``GET /instruction_text``; step/observation/close as above.
  Point ``agentenv``'s ``WebshopEnvClient`` at ``http://host:port/webshop``.

Every request accepts ``id`` or ``env_idx`` (body or query) for the session, and every task-index field
(``data_idx`` | ``game`` | ``session_id``) for the task. Task indices enumerate ``tasks("train")`` then
``tasks("test")`` (as AgentGym's ALFWorld server lists train then test games); ``GET /tasks`` lists them.

Fields beyond AgentGym's are extras its clients ignore: ``state`` (WebShop's name for the observation),
``score`` (the episode's return so far: SciWorld/BabyAI clients read it as the reward), ``info`` with
``admissible_actions``, ``success``, ``invalid_action``, ``terminated``, ``truncated``, ``task``.

Unlike AgentGym's servers (which answer 200 with ``{"error": ...}``), errors are 4xx/5xx with a one-line
``{"error": ...}`` body: 400 malformed JSON, 404 unknown session or task, 409 step before reset or after the
episode ended, 413 body too large, 422 missing/invalid fields, 503 session cap reached (``Retry-After``).
Env steps are synchronous CPU work: the endpoints are plain ``def`` so FastAPI runs them in its threadpool
(anyio's, 40 threads); a lock guards the session table and a per-session lock serialises the calls of one
session. ``max_sessions`` caps the live sessions; with ``idle_timeout_s``, sessions unused that long are
closed when the next session is created (or ``/health`` is asked), so the cap counts only live clients.
Run a single worker process: sessions live in its memory.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from fastapi import Depends, FastAPI, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dreamgym.envs.base import TextEnv, make
from dreamgym.types import Task

log = logging.getLogger(__name__)

DEFAULT_MAX_SESSIONS = 256
# Sessions unused this long are closed, so abandoned clients cannot hold the session cap forever.
DEFAULT_IDLE_TIMEOUT_S = 1800.0
DEFAULT_MAX_BODY_BYTES = 1 << 20  # actions are short; a megabyte is already generous


# ---------------------------------------------------------------------------------------------- sessions


@dataclass
class Session:
    """One env instance served to one client, with its episode bookkeeping."""

    env: TextEnv
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)
    is_reset: bool = False
    done: bool = False
    episode_return: float = 0.0
    data_idx: int | None = None
    last: dict[str, Any] = field(default_factory=dict)  # the last reset/step answer (for /detail)


class SessionStore:
    """Thread-safe table of sessions: create (under a cap), look up, close, evict the idle ones."""

    def __init__(
        self, factory: Callable[[], TextEnv], max_sessions: int, idle_timeout_s: float | None = None
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.factory = factory
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self._sessions: dict[int, Session] = {}
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending = 0  # sessions whose env is being built outside the lock
        self.evicted = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._sessions)

    def create(self) -> int:
        self.evict_idle()
        with self._lock:
            if len(self._sessions) + self._pending >= self.max_sessions:
                raise HTTPException(
                    503,
                    f"server is at its session cap ({self.max_sessions}); close a session (POST /close) "
                    "or restart with a larger --max-sessions",
                    headers={"Retry-After": "1"},
                )
            idx = self._next_id
            self._next_id += 1
            self._pending += 1
        try:
            env = self.factory()  # may be slow (e.g. building a catalog): done outside the table lock
        except Exception as e:
            log.exception("creating an env for session %d failed", idx)
            raise HTTPException(500, f"creating the env failed: {type(e).__name__}: {e}") from e
        finally:
            with self._lock:
                self._pending -= 1
        with self._lock:
            self._sessions[idx] = Session(env=env)
        return idx

    def get(self, idx: int) -> Session:
        with self._lock:
            session = self._sessions.get(idx)
        if session is None:
            raise HTTPException(404, f"unknown env id {idx} (never created, closed, or evicted as idle)")
        return session

    def holds(self, idx: int, session: Session) -> bool:
        with self._lock:
            return self._sessions.get(idx) is session

    def close(self, idx: int) -> bool:
        with self._lock:
            session = self._sessions.pop(idx, None)
        if session is None:
            return False
        with session.lock:  # wait for a call in flight on this session
            _close_env(session.env, idx)
        return True

    def close_all(self) -> None:
        for idx in self.ids():
            self.close(idx)

    def evict_idle(self) -> list[int]:
        """Close the sessions unused for ``idle_timeout_s`` (none while a call on them is in flight)."""
        if self.idle_timeout_s is None:
            return []
        now = time.monotonic()
        with self._lock:
            stale = [
                i
                for i, s in self._sessions.items()
                if now - s.last_used > self.idle_timeout_s and not s.lock.locked()
            ]
            evicted = [(i, self._sessions.pop(i)) for i in stale]
        for i, s in evicted:
            log.info("evicting env session %d after %.0f s idle", i, now - s.last_used)
            _close_env(s.env, i)
        self.evicted += len(evicted)
        return stale


def _close_env(env: TextEnv, idx: int) -> None:
    try:
        env.close()
    except Exception:  # a failing close must not keep the session (or the server) alive
        log.exception("closing env session %d failed", idx)


@contextmanager
def _using(store: SessionStore, idx: int) -> Iterator[Session]:
    """Hold one session for one call; turn an env crash into a 500 that names it (and keep serving)."""
    session = store.get(idx)
    with session.lock:
        if not store.holds(idx, session):  # closed or evicted while this call waited for the lock
            raise HTTPException(404, f"env id {idx} was closed while this request waited")
        session.last_used = time.monotonic()
        try:
            yield session
        except HTTPException:
            raise
        except Exception as e:
            log.exception("env session %d failed", idx)
            raise HTTPException(500, f"env error in session {idx}: {type(e).__name__}: {e}") from e
        finally:
            session.last_used = time.monotonic()


# ------------------------------------------------------------------------------------------ task index


class TaskIndex:
    """AgentGym-style integer task indices: ``tasks("train")`` first, then ``tasks("test")``."""

    SPLITS = ("train", "test")

    def __init__(self, env: TextEnv) -> None:
        self.entries: list[tuple[str, Task]] = [(s, t) for s in self.SPLITS for t in env.tasks(s)]
        self.by_id = {t.task_id: i for i, (_, t) in enumerate(self.entries)}

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, idx: int) -> tuple[str, Task]:
        if not 0 <= idx < len(self.entries):
            raise HTTPException(
                404, f"task index {idx} out of range (this env has {len(self.entries)} tasks)"
            )
        return self.entries[idx]

    def ranges(self) -> dict[str, str]:
        """Each split's indices as an inclusive ``"a-b"`` range (empty splits are left out)."""
        out: dict[str, str] = {}
        start = 0
        for split in self.SPLITS:
            n = sum(1 for s, _ in self.entries if s == split)
            if n:
                out[split] = f"{start}-{start + n - 1}"
            start += n
        return out


# ------------------------------------------------------------------------------------------- requests


class SessionRef(BaseModel):
    """A session named by ``id`` (ALFWorld, SciWorld, ...) or ``env_idx`` (WebShop)."""

    model_config = ConfigDict(extra="ignore")  # AgentGym clients send fields meant for other servers

    id: int | None = None
    env_idx: int | None = None

    def ref(self) -> int:
        return _pick_id(self.id, self.env_idx)


class StepRequest(SessionRef):
    action: str


class ResetRequest(SessionRef):
    data_idx: int | None = None  # SciWorld, BabyAI, TextCraft
    game: int | None = None  # ALFWorld
    session_id: int | None = None  # WebShop
    task_id: str | None = None  # dreamgym: a task by its id
    seed: int | None = Field(None, ge=0)
    split: Literal["train", "test"] = "train"  # the split to draw from when no task is named

    def task_index(self) -> int | None:
        for value in (self.data_idx, self.game, self.session_id):
            if value is not None:
                return value
        return None


def _pick_id(id_: int | None, env_idx: int | None) -> int:
    if id_ is None and env_idx is None:
        raise HTTPException(422, "missing the session: give 'id' (or 'env_idx'), as answered by POST /create")
    return id_ if id_ is not None else env_idx  # type: ignore[return-value]


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in info.items():
        try:
            out[key] = jsonable_encoder(value)
        except (TypeError, ValueError):  # an env put an object in info that JSON cannot hold
            out[key] = repr(value)
    return out


def _webshop_actions(actions: list[str]) -> dict[str, Any]:
    """Admissible ``search[...]``/``click[...]`` actions as WebShop's ``{has_search_bar, clickables}``."""
    has_search = any(a.startswith("search[") for a in actions)
    clicks = [a[len("click[") : -1] for a in actions if a.startswith("click[") and a.endswith("]")]
    return {"has_search_bar": has_search, "clickables": (["search"] if has_search else []) + clicks}


# ------------------------------------------------------------------------------------------------ app


def create_app(
    env_name: str,
    env_kwargs: dict[str, Any] | None = None,
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    api_key: str | None = None,
) -> FastAPI:
    """A FastAPI app serving ``make(env_name, **env_kwargs)`` sessions over the AgentGym protocol.

    With ``api_key``, every route but ``/`` and ``/health`` needs ``Authorization: Bearer <api_key>`` (else 401).

    One env is built here to validate the arguments and list the tasks, so a bad name or argument fails now.
    """
    kwargs = dict(env_kwargs or {})
    probe = make(env_name, **kwargs)
    tasks = TaskIndex(probe)
    probe.close()
    store = SessionStore(lambda: make(env_name, **kwargs), max_sessions, idle_timeout_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        store.close_all()  # shutdown: release every env

    def check_key(request: Request) -> None:
        if api_key is None or request.url.path in ("/", "/health"):
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise HTTPException(401, "invalid or missing API key (Authorization: Bearer ...)")

    app = FastAPI(title=f"dreamgym env server: {env_name}", version="1", lifespan=lifespan,
                  dependencies=[Depends(check_key)])
    app.state.store = store
    app.state.tasks = tasks
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    _install_error_handlers(app)

    # -- shared endpoints ------------------------------------------------------------------------
    def hello() -> str:
        return f"This is environment {env_name} (dreamgym)."

    def health() -> dict[str, Any]:
        store.evict_idle()
        return {
            "status": "ok",
            "env": env_name,
            "sessions": len(store),
            "max_sessions": store.max_sessions,
            "evicted": store.evicted,
            "tasks": len(tasks),
        }

    def list_envs() -> list[int]:
        return store.ids()

    def list_tasks() -> dict[str, Any]:
        return {
            "env": env_name,
            "ranges": tasks.ranges(),
            "tasks": [
                {"data_idx": i, "task_id": t.task_id, "split": s, "instruction": t.instruction}
                for i, (s, t) in enumerate(tasks.entries)
            ],
        }

    def create() -> dict[str, Any]:
        idx = store.create()
        return {"id": idx, "env_idx": idx, "observation": ""}  # TextCraft's client reads an observation

    def reset(body: ResetRequest) -> dict[str, Any]:
        idx = body.ref()
        with _using(store, idx) as s:
            data_idx = body.task_index()
            task: Task | None = None
            split: str = body.split
            if data_idx is not None:
                split, task = tasks[data_idx]
            elif body.task_id is not None:
                if body.task_id not in tasks.by_id:
                    raise HTTPException(404, f"unknown task id {body.task_id!r}")
                data_idx = tasks.by_id[body.task_id]
                split, task = tasks[data_idx]
            try:
                obs, info = s.env.reset(seed=body.seed, options={"task": task, "split": split})
            except (ValueError, KeyError) as e:  # the env refuses this reset (e.g. an empty split)
                raise HTTPException(400, f"reset refused: {type(e).__name__}: {e}".splitlines()[0]) from e
            played: Task | None = info.get("task")
            s.is_reset, s.done, s.episode_return, s.data_idx = True, False, 0.0, data_idx
            s.last = {
                "id": idx,
                "env_idx": idx,
                "data_idx": data_idx,
                "task_id": played.task_id if played else None,
                "task_description": played.instruction if played else "",
                "observation": obs,
                "state": obs,
                "available_actions": list(info.get("admissible_actions", [])),
                "reward": 0.0,
                "score": 0.0,
                "done": False,
                "info": _jsonable(info),
            }
            return s.last

    def step(body: StepRequest) -> dict[str, Any]:
        idx = body.ref()
        with _using(store, idx) as s:
            if not s.is_reset:
                raise HTTPException(409, f"env {idx} has not been reset; POST /reset first")
            if s.done:
                raise HTTPException(
                    409, f"the episode of env {idx} has finished; POST /reset to start another"
                )
            obs, reward, terminated, truncated, info = s.env.step(body.action)
            s.done = terminated or truncated
            s.episode_return += reward
            info = {**info, "terminated": terminated, "truncated": truncated}
            s.last = {
                "observation": obs,
                "state": obs,
                "reward": reward,
                "score": s.episode_return,
                "done": s.done,
                "available_actions": list(info.get("admissible_actions", [])),
                "info": _jsonable(info),
            }
            return s.last

    def observation(id_: int | None = Query(None, alias="id"), env_idx: int | None = None) -> str:
        with _using(store, _pick_id(id_, env_idx)) as s:
            return s.env.observation

    def available_actions(id_: int | None = Query(None, alias="id"), env_idx: int | None = None) -> list[str]:
        with _using(store, _pick_id(id_, env_idx)) as s:
            return list(s.env.last_info.get("admissible_actions", []))

    def detail(id_: int | None = Query(None, alias="id"), env_idx: int | None = None) -> dict[str, Any]:
        with _using(store, _pick_id(id_, env_idx)) as s:
            return {"done": s.done, "score": s.episode_return, **s.last}

    def close(body: SessionRef) -> dict[str, bool]:
        idx = body.ref()
        if not store.close(idx):
            raise HTTPException(404, f"unknown env id {idx} (never created, closed, or evicted as idle)")
        return {"closed": True}

    # -- WebShop dialect -------------------------------------------------------------------------
    def webshop_create() -> int:
        return store.create()

    def webshop_reset(body: ResetRequest) -> tuple[str, None]:
        return reset(body)["observation"], None

    def webshop_available_actions(
        env_idx: int | None = None, id_: int | None = Query(None, alias="id")
    ) -> dict[str, Any]:
        return _webshop_actions(available_actions(id_, env_idx))

    def webshop_instruction_text(
        env_idx: int | None = None, id_: int | None = Query(None, alias="id")
    ) -> str:
        with _using(store, _pick_id(id_, env_idx)) as s:
            return s.env.task.instruction if s.env.task else ""

    for prefix in ("", "/webshop"):
        app.add_api_route(f"{prefix}/", hello, methods=["GET"])
        app.add_api_route(f"{prefix}/health", health, methods=["GET"])
        app.add_api_route(f"{prefix}/list_envs", list_envs, methods=["GET"])
        app.add_api_route(f"{prefix}/tasks", list_tasks, methods=["GET"])
        app.add_api_route(f"{prefix}/step", step, methods=["POST"])
        app.add_api_route(f"{prefix}/observation", observation, methods=["GET"])
        app.add_api_route(f"{prefix}/detail", detail, methods=["GET"])
        app.add_api_route(f"{prefix}/close", close, methods=["POST"])
    app.add_api_route("/create", create, methods=["POST"])
    app.add_api_route("/reset", reset, methods=["POST"])
    app.add_api_route("/available_actions", available_actions, methods=["GET"])
    app.add_api_route("/webshop/create", webshop_create, methods=["POST"])
    app.add_api_route("/webshop/reset", webshop_reset, methods=["POST"])
    app.add_api_route("/webshop/available_actions", webshop_available_actions, methods=["GET"])
    app.add_api_route("/webshop/instruction_text", webshop_instruction_text, methods=["GET"])
    return app


# ----------------------------------------------------------------------------------------- errors


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    """Every error answer is ``{"error": "<one line>"}`` (AgentGym clients look for an ``error`` key)."""

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return _error(exc.status_code, str(exc.detail), dict(exc.headers or {}))

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        first = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            return _error(400, f"{request.url.path}: malformed JSON body")
        loc = ".".join(str(p) for p in first.get("loc", ()))
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        return _error(422, f"{request.url.path}: {loc}: {first.get('msg')}{more}")

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)


class BodyLimit:
    """ASGI middleware: answer 413 to a request body over ``max_bytes`` (counted, so chunked bodies too)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send)
            return
        # Bodies here are small JSON: read it whole (bounded), then replay it to the app.
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send: Send) -> None:
        payload = json.dumps({"error": f"request body over {self.max_bytes} bytes"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


# -------------------------------------------------------------------------------------------- running


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run the app in this process until interrupted (a single worker: sessions live in its memory)."""
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)


class BackgroundServer:
    """Run an app on a real socket in a daemon thread: ``with BackgroundServer(app) as url: ...``.

    Binds ``port`` (0 = any free port) before starting, so ``url`` is valid as soon as ``start`` returns.
    uvicorn installs signal handlers only from the main thread, so this is safe in tests and notebooks.
    """

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so (else ~40 ms per request).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the env server on {self.url} did not start within {timeout_s} s")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
