"""Play any AgentGym-protocol env server (WebShop, ALFWorld, SciWorld, BabyAI, ... or ``dreamgym env serve``).

``make("agentgym", url="http://127.0.0.1:36001", train_range="0-999", test_range="1000-1199")``

AgentGym's servers (github.com/WooooDyy/AgentGym) differ in small ways; one request works for all of them
because their pydantic bodies ignore unknown fields and FastAPI ignores unknown query parameters:

* the session: we send both ``id`` (ALFWorld, SciWorld, BabyAI, TextCraft) and ``env_idx`` (WebShop);
  ``POST /create`` may answer ``{"id": n}`` or a bare ``n`` (WebShop).
* the task: we send its index as ``data_idx`` (SciWorld, BabyAI, TextCraft), ``game`` (+ ``world_type``,
  ALFWorld) and ``session_id`` (WebShop). A task is ``Task(task_id=f"{env_name}-{idx}", env="agentgym",
  goal={"data_idx": idx})``. ``tasks(split)`` lists ``{split}_range`` (e.g. ``"0-999"``), or when that is not
  set, the split's range in the server's ``GET /tasks`` listing (dreamgym servers have one, AgentGym's do
  not). The instruction comes from that listing, else ``task_description`` (SciWorld), else ``GET
  /instruction_text`` (WebShop), else the first observation.
* the answer: ``observation`` or ``state`` (WebShop) or ``[observation, null]`` (WebShop reset). SciWorld's
  ``task_description`` becomes the task's instruction; it is not glued onto the observation (AgentGym's
  SciWorld client does that) because a TextEnv hands the task over apart, in ``info["task"]``.
* info: the server's ``info`` fields (dreamgym servers send the env's whole info) are passed through, except
  ``task``, ``steps``, ``terminated`` and ``truncated``, which this env sets itself.
* admissible actions: ``available_actions`` in the answer (ALFWorld, dreamgym), else ``GET
  /available_actions`` (a list, or WebShop's ``{has_search_bar, clickables}`` turned into ``search[...]``
  and ``click[x]``); a server without it (404) gives ``[]``.
* reward: ``float(answer[reward_key]) * reward_scale`` per step. ``done`` ends the episode (terminated,
  unless the server's ``info.truncated`` says it hit its own step limit). ``success`` is the server's
  ``info.success`` when it sends one, else ``episode return >= success_threshold`` when done (WebShop: reward
  1.0; ALFWorld: ``won`` = 1.0; SciWorld: ``reward_scale=0.01`` so that a score of 100 is 1.0).
  ``invalid_action`` is the server's ``info.invalid_action`` when sent, else False.
* errors: a connection failure (or a 503, the server at its session cap) is retried ``retries`` times with
  exponential backoff; then, like any error answer (4xx/5xx, or AgentGym's 200 ``{"error": ...}``), it raises
  :class:`EnvServerError` with one line naming the server, the request and the reason. A ``/step`` or
  ``/create`` that reached the server is never resent (they are not idempotent); a timed-out ``/reset`` or
  GET is.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import httpx

from dreamgym.envs.base import TextEnv
from dreamgym.types import Task

log = logging.getLogger(__name__)

# The task-index fields of AgentGym's reset bodies, all sent at once (each server reads its own).
_TASK_FIELDS = ("data_idx", "game", "session_id")
# Info keys a served env sends that describe its own side of the episode (this env sets its own).
_OWN_INFO = frozenset({"task", "steps", "terminated", "truncated"})


class EnvServerError(ConnectionError):
    """An env server is unreachable or answered an error. The message is one line."""


def parse_range(spec: str) -> list[int]:
    """``"0-999"`` -> 0..999 inclusive; ``"3"`` -> [3]; ``"0-9,20-29"`` -> both runs."""
    out: list[int] = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = (int(lo), int(hi)) if sep else (int(lo), int(lo))
        except ValueError:
            raise ValueError(f"bad task range {spec!r}: expected like '0-999' or '0-9,20-29'") from None
        if a < 0 or b < a:
            raise ValueError(f"bad task range {spec!r}: {part!r} is empty or negative")
        out.extend(range(a, b + 1))
    return out


class AgentGymEnv(TextEnv):
    """A :class:`TextEnv` whose episodes run on a remote AgentGym-protocol server (one session per env)."""

    name = "agentgym"

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        env_name: str = "agentgym",
        train_range: str | None = None,
        test_range: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        reward_key: str = "reward",
        reward_scale: float = 1.0,
        success_threshold: float = 1.0,
        world_type: str = "Text",
        max_steps: int = 15,
        api_key_env: str | None = None,
        val_range: str | None = None,
    ) -> None:
        super().__init__(max_steps=max_steps)
        self.url = url.rstrip("/")
        self.reward_key = reward_key
        self.reward_scale = reward_scale
        self.success_threshold = success_threshold
        self.world_type = world_type
        self.retries = retries
        self.backoff = backoff
        self.env_name = env_name
        self._ranges = {"train": train_range, "val": val_range, "test": test_range}
        # trust_env=False: a proxy set in the environment must not capture calls to a local env server.
        # The key is read from the named env var, so it never enters make_kwargs (recorded in trajectories).
        headers = {}
        if api_key_env is not None:
            key = os.environ.get(api_key_env)
            if not key:
                raise ValueError(f"api_key_env {api_key_env}: the environment variable is unset or empty")
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)), trust_env=False,
                                  headers=headers)
        self._env_id: int | None = None
        self._listing: dict[str, Any] | None = None  # GET /tasks of a dreamgym server, fetched once
        self._has_actions_endpoint = True
        self._has_instruction_endpoint = True
        self._seed: int | None = None
        self._return = 0.0
        self._server_truncated = False

    # -- tasks ------------------------------------------------------------------------------------
    def tasks(self, split: str = "train") -> list[Task]:
        spec = self._ranges.get(split)
        listing = self._task_listing() if spec is None else None
        if spec is None:
            if listing is None:
                raise ValueError(
                    f"the server at {self.url} does not list its tasks; pass {split}_range='a-b' "
                    "(the task indices of that split)"
                )
            spec = listing["ranges"].get(split, "")
        known = {int(t["data_idx"]): t for t in (listing or {}).get("tasks", [])}
        return [self._task(i, known.get(i)) for i in parse_range(spec or "")]

    def get_task(self, task_id: str) -> Task:
        prefix, _, idx = task_id.rpartition("-")
        if prefix != self.env_name or not idx.isdigit():
            raise KeyError(f"unknown task id {task_id!r}: expected '{self.env_name}-<index>'")
        return self._task(int(idx), None)

    def _task(self, idx: int, listed: dict[str, Any] | None) -> Task:
        goal: dict[str, Any] = {"data_idx": idx}
        if listed is not None:
            goal["server_task_id"] = listed["task_id"]
        instruction = str(listed["instruction"]) if listed else ""
        return Task(task_id=f"{self.env_name}-{idx}", instruction=instruction, env="agentgym", goal=goal)

    def _task_listing(self) -> dict[str, Any] | None:
        """A dreamgym server's ``GET /tasks`` (None for AgentGym's servers, which have no listing)."""
        if self._listing is None:
            answer = self._request("GET", "/tasks", idempotent=True, missing_ok=True)
            self._listing = answer if isinstance(answer, dict) and "ranges" in answer else {}
        return self._listing or None

    # -- TextEnv ----------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        self._seed = seed
        return super().reset(seed=seed, options=options)

    def _reset(self, task: Task | None, split: str) -> tuple[str, dict[str, Any]]:
        if task is None:
            raise ValueError(f"no task to play: the {split} split is empty (set {split}_range)")
        if "data_idx" not in task.goal:
            raise ValueError(f"task {task.task_id!r} has no goal['data_idx'] (the server's task index)")
        idx = int(task.goal["data_idx"])
        self._ensure_session()
        body: dict[str, Any] = dict.fromkeys(_TASK_FIELDS, idx)
        body["world_type"] = self.world_type
        if self._seed is not None:
            body["seed"] = self._seed
        answer = self._post("/reset", body)
        instruction = task.instruction
        if isinstance(answer, list | tuple):  # WebShop: [observation, None]
            obs = str(answer[0]) if answer and answer[0] is not None else self._get("/observation")
            fields: dict[str, Any] = {}
        elif isinstance(answer, dict):
            fields = answer
            obs = str(fields.get("observation", fields.get("state", "")))
            instruction = instruction or str(fields.get("task_description") or "")
        else:
            obs, fields = str(answer), {}
        instruction = instruction or self._instruction_text() or obs
        self.task = task.model_copy(update={"instruction": instruction})
        self._return, self._server_truncated = 0.0, False
        info = _server_info(fields)
        info["admissible_actions"] = self._actions(fields)
        return obs, info

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        answer = self._post("/step", {"action": action}, idempotent=False)
        if not isinstance(answer, dict):
            raise EnvServerError(f"{self.url}/step answered {type(answer).__name__}, expected a JSON object")
        obs = str(answer.get("observation", answer.get("state", "")))
        try:
            reward = float(answer.get(self.reward_key) or 0.0) * self.reward_scale
        except (TypeError, ValueError):
            raise EnvServerError(
                f"{self.url}/step: {self.reward_key!r} is not a number in {answer!r}"
            ) from None
        done = bool(answer.get("done", False))
        raw_info = answer.get("info")
        server_info = _server_info(answer)
        self._return += reward
        # The server ended the episode on its own step limit: a truncation, not a terminal state.
        self._server_truncated = done and isinstance(raw_info, dict) and bool(raw_info.get("truncated"))
        success = server_info.get("success")
        if success is None:
            success = done and self._return >= self.success_threshold
        info = dict(server_info)
        info["admissible_actions"] = self._actions(answer)
        info["success"] = bool(success)
        info["invalid_action"] = bool(server_info.get("invalid_action", False))
        return obs, reward, done and not self._server_truncated, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated or self._server_truncated, info

    def close(self) -> None:
        """Release the server session (tolerating servers without ``/close`` or already gone)."""
        if self._env_id is not None:
            try:
                self._request("POST", "/close", json=self._with_id({}), missing_ok=True, attempts=1)
            except EnvServerError as e:
                log.warning("could not close session %s: %s", self._env_id, e)
            self._env_id = None
        self._http.close()
        super().close()

    # -- protocol helpers -------------------------------------------------------------------------
    def _ensure_session(self) -> None:
        if self._env_id is not None:
            return
        answer = self._request("POST", "/create", json={}, idempotent=False)
        if isinstance(answer, dict):
            answer = answer.get("id", answer.get("env_idx"))
        if not isinstance(answer, int):
            raise EnvServerError(f"{self.url}/create answered {answer!r}, expected an env id")
        self._env_id = answer

    def _actions(self, fields: dict[str, Any]) -> list[str]:
        if isinstance(fields.get("available_actions"), list):
            return [str(a) for a in fields["available_actions"]]
        if not self._has_actions_endpoint:
            return []
        answer = self._get("/available_actions", missing_ok=True)
        if answer is None:
            self._has_actions_endpoint = False
            return []
        if isinstance(answer, list):
            return [str(a) for a in answer]
        if isinstance(answer, dict) and "clickables" in answer:  # WebShop
            clicks = [f"click[{c}]" for c in answer["clickables"] if c != "search"]
            return (["search[<query>]"] if answer.get("has_search_bar") else []) + clicks
        return []

    def _instruction_text(self) -> str:
        if not self._has_instruction_endpoint:
            return ""
        answer = self._get("/instruction_text", missing_ok=True)
        if answer is None:
            self._has_instruction_endpoint = False
        return answer if isinstance(answer, str) else ""

    def _with_id(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "id": self._env_id, "env_idx": self._env_id}

    def _post(self, path: str, body: dict[str, Any], idempotent: bool = True) -> Any:
        return self._request("POST", path, json=self._with_id(body), idempotent=idempotent)

    def _get(self, path: str, missing_ok: bool = False) -> Any:
        params = {"id": self._env_id, "env_idx": self._env_id}
        return self._request("GET", path, params=params, idempotent=True, missing_ok=missing_ok)

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        idempotent: bool = True,
        missing_ok: bool = False,
        attempts: int | None = None,
    ) -> Any:
        """One call with retries on connection errors and 503; ``None`` for a 404/405 when ``missing_ok``."""
        where = f"{method} {self.url}{path}"
        attempts = attempts or self.retries + 1
        # Resend a request that never reached the server; after a read timeout, only an idempotent one.
        retriable: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout)
        if idempotent:
            retriable += (httpx.ReadTimeout, httpx.RemoteProtocolError)
        reason = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                res = self._http.request(method, f"{self.url}{path}", json=json, params=params)
            except retriable as e:
                reason = f"{type(e).__name__}: {e}".splitlines()[0]
                continue
            except httpx.HTTPError as e:
                raise EnvServerError(f"{where} failed: {type(e).__name__}: {e}".splitlines()[0]) from None
            if res.status_code == 503:
                reason = f"503 {_error_text(res)}"
                continue
            if missing_ok and res.status_code in (404, 405) and _is_missing_route(res):
                return None
            if res.status_code >= 400:
                raise EnvServerError(f"{where} -> {res.status_code}: {_error_text(res)}")
            try:
                answer = res.json()
            except ValueError:
                raise EnvServerError(f"{where} answered non-JSON: {res.text[:200]!r}") from None
            if isinstance(answer, dict) and "error" in answer:  # AgentGym servers answer errors with 200
                raise EnvServerError(f"{where} -> error: {answer['error']}".splitlines()[0])
            return answer
        raise EnvServerError(
            f"cannot reach the env server: {where} failed after {attempts} attempts ({reason})"
        )


def _server_info(answer: dict[str, Any]) -> dict[str, Any]:
    """The ``info`` object of an answer, less the keys that describe the server's side of the episode."""
    info = answer.get("info")
    return {k: v for k, v in info.items() if k not in _OWN_INFO} if isinstance(info, dict) else {}


def _error_text(res: httpx.Response) -> str:
    try:
        body = res.json()
    except ValueError:
        return res.text[:200].replace("\n", " ")
    if isinstance(body, dict):
        return str(body.get("error", body.get("detail", body))).replace("\n", " ")
    return str(body)[:200]


def _is_missing_route(res: httpx.Response) -> bool:
    """A route the server does not have (FastAPI's ``{"detail": "Not Found"}``), not a missing session."""
    try:
        body = res.json()
    except ValueError:
        return True
    return not (isinstance(body, dict) and "error" in body)
