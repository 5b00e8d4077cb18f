"""Env pools: many episodes of one environment stepped side by side, behind one small interface.

A pool owns ``num_envs`` slots, each holding one env instance. Rollouts reset slots with tasks and step a
batch of slots with the policy's actions; they never ask whether the slots are local objects
(:class:`LocalEnvPool`) or Ray actors in other processes (:class:`RayEnvPool`, for slow or remote envs such
as ScienceWorld or AgentGym servers), nor whether the env is the real one or the dream.

Only the essentials of ``info`` cross the pool boundary (:func:`info_essentials`): the admissible actions,
the success and invalid-action flags, and the env's small scalar extras (the ``task`` object stays behind).

The trainer talks to every pool through the same hooks (:class:`PoolHooks`): the dream
(:class:`~dreamgym.experience.dream.DreamEnvPool`) tags, checkpoints and reports its co-evolving replay buffer
and lends its experience model to the curriculum; the real pools keep the no-op defaults.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from dreamgym.envs.base import TextEnv, make
from dreamgym.types import Source, Task

EnvFactory = Callable[[], TextEnv]
_T = TypeVar("_T")


@dataclass
class StepResult:
    """What one ``env.step`` returned (``info`` reduced to its essentials)."""

    obs: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def info_essentials(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` without the ``task`` object: the admissible actions, flags and the env's scalar extras."""
    return {k: v for k, v in info.items() if k != "task"}


def env_factory(name: str, **env_kwargs: Any) -> EnvFactory:
    """A picklable factory for a registered env (Ray ships it to its actors)."""
    return functools.partial(make, name, **env_kwargs)


class PoolHooks:
    """What the trainer may ask of any pool beyond stepping it; these defaults (a real env's) do nothing.

    ``task_generator_llm``: the LLM the curriculum's ``llm`` task generator prompts (the dream: the experience
    model's). ``encoder``: the semantic embedder φ that clusters tasks for the curriculum (the dream: its replay
    buffer's); None lets the trainer choose one.
    """

    @property
    def task_generator_llm(self) -> Any:
        return None

    @property
    def encoder(self) -> Any:
        return None

    def on_iteration_start(self, iteration: int) -> None:
        """Called before each iteration's rollouts (the dream tags its synthetic transitions with it)."""

    def checkpoint_state(self) -> dict[str, Any]:
        """Fields of the trainer's checkpointed state this pool sets when a checkpoint is written."""
        return {}

    def load_checkpoint_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Restore from a checkpoint's state on resume; returns the fields of it this pool changed."""
        return {}

    def report(self) -> dict[str, Any]:
        """What this pool adds to the run's ``summary.json``."""
        return {}


@runtime_checkable
class EnvPool(Protocol):
    """Slots ``0..num_envs-1``, each one env. ``source`` is what the env's trajectories are ("real" for a real
    env, "synthetic" for the dream; read from the env's ``source`` attribute, "real" when it has none).
    The hooks are :class:`PoolHooks`'s."""

    num_envs: int
    name: str
    source: Source

    @property
    def task_generator_llm(self) -> Any: ...

    @property
    def encoder(self) -> Any: ...

    def tasks(self, split: str) -> list[Task]: ...

    def reset_batch(
        self, indices: Sequence[int], tasks: Sequence[Task], seeds: Sequence[int], split: str
    ) -> list[tuple[str, dict[str, Any]]]: ...

    def step_batch(self, indices: Sequence[int], actions: Sequence[str]) -> list[StepResult]: ...

    def close(self) -> None: ...

    def on_iteration_start(self, iteration: int) -> None: ...

    def checkpoint_state(self) -> dict[str, Any]: ...

    def load_checkpoint_state(self, state: dict[str, Any]) -> dict[str, Any]: ...

    def report(self) -> dict[str, Any]: ...


def _reset(env: TextEnv, task: Task, seed: int, split: str) -> tuple[str, dict[str, Any]]:
    obs, info = env.reset(seed=seed, options={"task": task, "split": split})
    return obs, info_essentials(info)


def _step(env: TextEnv, action: str) -> StepResult:
    obs, reward, terminated, truncated, info = env.step(action)
    return StepResult(obs, reward, terminated, truncated, info_essentials(info))


def _source(env: TextEnv) -> Source:
    source = getattr(env, "source", "real")
    if source == "real" or source == "synthetic":
        return "real" if source == "real" else "synthetic"
    raise ValueError(f"env {env.name!r} has source {source!r}; expected 'real' or 'synthetic'")


class LocalEnvPool(PoolHooks):
    """``num_envs`` env instances in this process, made by ``factory``; stepped one after the other.

    Envs that advertise ``concurrent_sessions > 1`` (:class:`~dreamgym.envs.latency.LatencyEnv`: a real env's
    cost model, thread-safe by construction) are reset and stepped from a thread pool of that many workers, so a
    batch of B envs with N sessions of S seconds takes about ceil(B/N)·S instead of B·S. Every other env is
    stepped one after the other in the caller's thread, as always (envs need not be thread-safe).
    """

    def __init__(self, factory: EnvFactory, num_envs: int) -> None:
        if num_envs < 1:
            raise ValueError(f"an env pool needs at least one env, got num_envs={num_envs}")
        self.envs = [factory() for _ in range(num_envs)]
        self.num_envs = num_envs
        self.name = self.envs[0].name
        self.source: Source = _source(self.envs[0])
        workers = min(int(getattr(self.envs[0], "concurrent_sessions", 1)), num_envs)
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="env-session") if workers > 1 else None

    def tasks(self, split: str) -> list[Task]:
        return self.envs[0].tasks(split)

    def reset_batch(
        self, indices: Sequence[int], tasks: Sequence[Task], seeds: Sequence[int], split: str
    ) -> list[tuple[str, dict[str, Any]]]:
        calls = [functools.partial(_reset, self.envs[i], t, s, split)
                 for i, t, s in zip(indices, tasks, seeds, strict=True)]
        return self._run(calls)

    def step_batch(self, indices: Sequence[int], actions: Sequence[str]) -> list[StepResult]:
        return self._run([functools.partial(_step, self.envs[i], a) for i, a in zip(indices, actions, strict=True)])

    def _run(self, calls: Sequence[Callable[[], _T]]) -> list[_T]:
        """The calls' results in order: one after the other, or from the session threads."""
        if self._threads is None or len(calls) < 2:
            return [call() for call in calls]
        return [f.result() for f in [self._threads.submit(call) for call in calls]]

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None
        for env in self.envs:
            env.close()


class _EnvActor:
    """One env inside a Ray actor process (wrapped by ``ray.remote`` in :class:`RayEnvPool`)."""

    def __init__(self, factory: EnvFactory) -> None:
        self.env = factory()

    def describe(self) -> tuple[str, Source]:
        return self.env.name, _source(self.env)

    def tasks(self, split: str) -> list[Task]:
        return self.env.tasks(split)

    def reset(self, task: Task, seed: int, split: str) -> tuple[str, dict[str, Any]]:
        return _reset(self.env, task, seed, split)

    def step(self, action: str) -> StepResult:
        return _step(self.env, action)


class RayEnvPool(PoolHooks):
    """The same interface with each env in its own Ray actor, so slow envs step in parallel processes.

    ``factory`` must be picklable (use :func:`env_factory`). Ray is imported here only; install it with
    ``pip install 'dreamgym[ray]'``. A Ray cluster already started by the caller is reused; with ``RAY_ADDRESS`` set
    (e.g. ``auto`` on a node of a cluster started with ``ray start``) the pool joins that cluster, whose actors
    may then run on any of its nodes (the env's package must be installed on each).
    """

    def __init__(self, factory: EnvFactory, num_envs: int, num_cpus: int = 2, step_timeout_s: float = 300.0) -> None:
        try:
            import ray
        except ImportError:
            raise ImportError("RayEnvPool needs ray: pip install 'dreamgym[ray]'") from None
        if num_envs < 1:
            raise ValueError(f"an env pool needs at least one env, got num_envs={num_envs}")
        if not ray.is_initialized():
            if os.environ.get("RAY_ADDRESS"):  # a running cluster (`ray start`, across nodes): its CPUs, not ours
                ray.init(log_to_driver=False)
            else:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        self._ray = ray
        remote_actor: Any = ray.remote(num_cpus=0)(_EnvActor)  # an idle env needs no CPU reserved
        self.actors: list[Any] = [remote_actor.remote(factory) for _ in range(num_envs)]
        self.timeout_s = step_timeout_s
        self.num_envs = num_envs
        self.name, self.source = self._get([self.actors[0].describe.remote()])[0]

    def _get(self, refs: list[Any]) -> list[Any]:
        try:
            return list(self._ray.get(refs, timeout=self.timeout_s))
        except self._ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"Ray env pool: no answer from an env actor within {self.timeout_s:.0f} s") from None

    def tasks(self, split: str) -> list[Task]:
        return list(self._get([self.actors[0].tasks.remote(split)])[0])

    def reset_batch(
        self, indices: Sequence[int], tasks: Sequence[Task], seeds: Sequence[int], split: str
    ) -> list[tuple[str, dict[str, Any]]]:
        refs = [self.actors[i].reset.remote(t, s, split) for i, t, s in zip(indices, tasks, seeds, strict=True)]
        return self._get(refs)

    def step_batch(self, indices: Sequence[int], actions: Sequence[str]) -> list[StepResult]:
        return self._get([self.actors[i].step.remote(a) for i, a in zip(indices, actions, strict=True)])

    def close(self) -> None:
        for actor in self.actors:
            self._ray.kill(actor)
        self.actors = []


def make_pool(factory: EnvFactory, num_envs: int, backend: str = "local", num_cpus: int = 2) -> EnvPool:
    """``backend``: ``local`` (in-process) or ``ray`` (one actor per env)."""
    if backend == "local":
        return LocalEnvPool(factory, num_envs)
    if backend == "ray":
        return RayEnvPool(factory, num_envs, num_cpus=num_cpus)
    raise ValueError(f"unknown env pool backend {backend!r}; choose local or ray")


__all__ = [
    "EnvFactory",
    "EnvPool",
    "LocalEnvPool",
    "PoolHooks",
    "RayEnvPool",
    "StepResult",
    "env_factory",
    "info_essentials",
    "make_pool",
]
