"""A real-env cost model: every reset and step of an env costs ``latency_s`` seconds, with at most ``sessions``
of them in flight at once (issue 13, item 5).

Real envs (a web shop behind HTTP, a game server, ScienceWorld's JVM) are slow and serve a bounded number of
sessions; the shop and TextWorld here answer in microseconds. :class:`LatencyEnv` wraps any :class:`TextEnv`
so that its interaction costs what a real one would, which is what DreamGym's dream saves:

* each ``reset`` and ``step`` holds one of ``sessions`` slots of a process-wide semaphore (shared by every
  ``LatencyEnv`` of the same ``session_group``, by default the env's name and ``sessions``), then **sleeps**
  ``latency_s`` (no busy work: the CPU stays free for the policy), then runs the wrapped env's own reset/step;
* the wrapped env's own code runs under one process-wide lock, so envs never written for threads (shared
  catalogs, caches, a JVM bridge) are only ever entered by one thread at a time; only the sleeps overlap.

Design (the least invasive honest one): the wrapper is thread-safe and advertises ``concurrent_sessions``;
:class:`~dreamgym.envs.pool.LocalEnvPool` steps and resets a batch from a thread pool of that many workers
when its envs advertise more than one session, and one after the other (exactly as before) otherwise. So a
batch of B envs with N sessions takes ≈ ceil(B/N)·S, not B·S, and nothing changes for an env without latency.
The semaphore, not the thread count, is what bounds the sessions: a second pool of the same group (e.g. the
evaluation's) shares the same N.

The bound is per process: with :class:`~dreamgym.envs.pool.RayEnvPool` each actor would hold its own
semaphore, so the trainer refuses ``real_latency_s`` with the Ray backend.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from dreamgym.envs.base import ScriptedPolicy, TextEnv
from dreamgym.types import Task

_SESSIONS: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_SESSIONS_LOCK = threading.Lock()
_ENV_LOCK = threading.RLock()  # the wrapped envs' own code: one thread at a time


def check_latency(latency_s: float, sessions: int) -> None:
    """A one-line ``ValueError`` for a negative latency or fewer than one session."""
    if not latency_s >= 0:  # also refuses NaN
        raise ValueError(f"real-env latency must be >= 0 seconds, got {latency_s}")
    if sessions < 1:
        raise ValueError(f"real-env sessions must be >= 1, got {sessions}")


def session_slots(group: str, sessions: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore of ``sessions`` slots for ``group`` (made on first use)."""
    with _SESSIONS_LOCK:
        key = (group, sessions)
        if key not in _SESSIONS:
            _SESSIONS[key] = threading.BoundedSemaphore(sessions)
        return _SESSIONS[key]


class LatencyEnv(TextEnv):
    """``env`` whose every ``reset`` (``reset_latency_s``, by default ``latency_s``) and ``step`` costs
    ``latency_s`` seconds of sleep, at most ``sessions`` at once per ``session_group`` (see the module)."""

    def __init__(self, env: TextEnv, latency_s: float, sessions: int = 1, reset_latency_s: float | None = None,
                 session_group: str | None = None) -> None:
        check_latency(latency_s, sessions)
        reset_s = latency_s if reset_latency_s is None else reset_latency_s
        check_latency(reset_s, sessions)
        self.env = env
        super().__init__(max_steps=env.max_steps)
        self.name = env.name
        self.source = getattr(env, "source", "real")
        self.make_kwargs = env.make_kwargs
        self.env_spec = env.env_spec
        self.latency_s, self.reset_latency_s = float(latency_s), float(reset_s)
        self.concurrent_sessions = sessions
        self.slots = session_slots(session_group or env.name, sessions)
        self.charged_s = 0.0  # the latency this env has slept (session-seconds)

    def __getattr__(self, name: str) -> Any:  # env-specific attributes (e.g. the shop's catalog)
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)
            self.charged_s += seconds

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        with self.slots:
            self._wait(self.reset_latency_s)
            with _ENV_LOCK:
                obs, info = self.env.reset(seed=seed, options=options)
        self.task, self.steps = self.env.task, self.env.steps
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        with self.slots:
            self._wait(self.latency_s)
            with _ENV_LOCK:
                result = self.env.step(action)
        self.steps = self.env.steps
        return result

    def tasks(self, split: str = "train") -> list[Task]:
        return self.env.tasks(split)

    def get_task(self, task_id: str) -> Task:
        return self.env.get_task(task_id)

    def render(self) -> str:
        return self.env.render()

    @property
    def observation(self) -> str:
        return self.env.observation

    @property
    def last_info(self) -> dict[str, Any]:
        return self.env.last_info

    def admissible_for_state(self, state: str) -> list[str] | None:
        return self.env.admissible_for_state(state)

    def action_valid_for_state(self, state: str, action: str) -> bool | None:
        return self.env.action_valid_for_state(state, action)

    def had_effect(self, state: str, next_state: str) -> bool | None:
        return self.env.had_effect(state, next_state)

    def scripted_policy(self, name: str, seed: int = 0, **kwargs: Any) -> ScriptedPolicy:
        return self.env.scripted_policy(name, seed=seed, **kwargs)

    def close(self) -> None:
        self.env.close()


def _make_latency_env(factory: Callable[[], TextEnv], latency_s: float, sessions: int) -> TextEnv:
    return LatencyEnv(factory(), latency_s, sessions)


def with_latency(factory: Callable[[], TextEnv], latency_s: float, sessions: int) -> Callable[[], TextEnv]:
    """``factory``'s envs wrapped in :class:`LatencyEnv` (``factory`` itself when ``latency_s`` is 0);
    picklable when ``factory`` is. Refuses a negative latency or ``sessions < 1`` (one line)."""
    check_latency(latency_s, sessions)
    if latency_s == 0:
        return factory
    return functools.partial(_make_latency_env, factory, float(latency_s), int(sessions))


__all__ = ["LatencyEnv", "check_latency", "session_slots", "with_latency"]
