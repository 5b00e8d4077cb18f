"""``ScienceWorldEnv``: ScienceWorld (Wang et al. 2022; 30 science task types, a Scala simulator in a JVM)
behind the dreamgym API.

``make("scienceworld", task="find-living-thing,lifespan-longest-lived", simplification="", admissible=True)``
covers one or several task types; each type's train/val/test split is ScienceWorld's own variation split
(``get_variations_train`` / ``get_variations_dev`` / ``get_variations_test``: disjoint variations; ``"dev"``
is accepted as another name of val), optionally pinned to one ``variation`` (then every split plays it) or
capped at ``max_variations`` per type.

* Speed. The official wrapper's ``step`` asks the simulator for every valid action-object combination
  on every step (~10-20 steps/s). This env steps the simulator directly (``server.step`` + score, a few
  hundred steps/s) and reads the room with the simulator's free look/inventory. ``admissible=True``
  still asks for the valid combinations and shows a compact menu of them (exact, slow);
  ``admissible=False`` shows a menu derived from the room text alone (cheap; entries usually valid) —
  use it for the oracle/noisy data collection and for pooled throughput.
* Invalid actions (the parser's "No known action matches that input.") leave the state, give reward 0 and
  set ``info["invalid_action"]``; an ambiguous action is resolved to ScienceWorld's first reading (as its
  baseline agents do), counted in ``info["ambiguous_resolved"]``.
* Outcome reward: 0 on every step but the last; on termination ScienceWorld's score (0-100) / 100,
  0 when the task failed (negative score, e.g. focusing on the wrong object). ``info["success"]``: score 100.
* One JVM (~0.9 GB) per env, reused across episodes; ``close()`` shuts it down and waits for it,
  ``__del__`` and an ``atexit`` hook do the same for envs never closed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import weakref
from typing import Any

from dreamgym.envs.base import TextEnv
from dreamgym.envs.scienceworld.state import (
    abstract_state,
    actions_in_state,
    derived_actions,
    parse_inventory,
    parse_look,
    verified_actions,
)
from dreamgym.types import Task

logger = logging.getLogger(__name__)

# Short task types whose gold paths work (5-17 steps; benchmarks/bench_text_envs.py and the report list more).
DEFAULT_TASKS = ("find-living-thing", "lifespan-longest-lived", "chemistry-mix-paint-secondary-color")
# Our split names -> ScienceWorld's variation sets ("dev" kept as ScienceWorld's own name for val).
SIM_SPLITS = {"train": "train", "val": "dev", "dev": "dev", "test": "test"}
INVALID_REPLY = "No known action matches that input."
AMBIGUOUS_REPLY = "Ambiguous request"
_LIVE_ENVS: weakref.WeakSet[ScienceWorldEnv] = weakref.WeakSet()


@atexit.register
def _close_live_envs() -> None:
    for env in list(_LIVE_ENVS):
        env.close()


def _task_names(task: str | list[str] | tuple[str, ...]) -> list[str]:
    names = [t.strip() for t in task.split(",")] if isinstance(task, str) else [str(t).strip() for t in task]
    names = [n for n in names if n]
    if not names:
        raise ValueError("scienceworld env: no task type given")
    return names


class ScienceWorldEnv(TextEnv):
    name = "scienceworld"

    def __init__(
        self,
        task: str | list[str] | tuple[str, ...] = DEFAULT_TASKS,
        variation: int | None = None,
        simplification: str = "",
        admissible: bool = True,
        max_variations: int | None = None,
        max_steps: int = 30,
        max_actions: int = 30,
        max_text: int = 160,
    ) -> None:
        super().__init__(max_steps=max_steps)
        if min(max_steps, max_actions, max_text) < 1 or (max_variations is not None and max_variations < 1):
            raise ValueError("scienceworld env: max_steps, max_actions, max_text and max_variations must be >= 1")
        # The extra is imported only when the env is made.
        from scienceworld import ScienceWorldEnv as Simulator

        self.task_types = _task_names(task)
        self.variation, self.simplification = variation, simplification
        self.admissible, self.max_variations = admissible, max_variations
        self.max_actions, self.max_text = max_actions, max_text
        self._sim: Any = Simulator("")  # starts the JVM
        self._java = self._sim._gateway.java_process
        _LIVE_ENVS.add(self)
        unknown = set(self.task_types) - set(self._sim.get_task_names())
        if unknown:
            self.close()
            raise ValueError(f"scienceworld env: unknown task types {sorted(unknown)}")
        self._tasks: dict[str, list[Task]] = {}
        self._loaded: tuple[str, int, bool] | None = None  # (task type, variation, gold path generated)
        self._gold: dict[tuple[str, int], list[str]] = {}
        self._done = False
        self._score = 0.0

    # -- tasks ------------------------------------------------------------------------------------
    def tasks(self, split: str = "train") -> list[Task]:
        """Per task type, ScienceWorld's variations of ``split`` (train, val = ScienceWorld's dev, test), as tasks."""
        if split not in SIM_SPLITS:
            raise ValueError(f"scienceworld env: unknown split {split!r} (train, val or test)")
        split = SIM_SPLITS[split]
        if split not in self._tasks:
            self._tasks[split] = [t for name in self.task_types for t in self._tasks_of(name, split)]
        return list(self._tasks[split])

    def _tasks_of(self, name: str, split: str) -> list[Task]:
        self._load(name, 0)
        if self.variation is not None:
            variations = [self.variation]
        else:
            split_of = {"train": self._sim.get_variations_train, "dev": self._sim.get_variations_dev,
                        "test": self._sim.get_variations_test}
            variations = sorted(int(v) for v in split_of[split]())[: self.max_variations]
        tasks = []
        for var in variations:
            self._load(name, var)
            instruction = " ".join(self._sim.server.getTaskDescription().replace("Task Description:", "").split())
            goal = {"task_name": name, "variation": var, "simplification": self.simplification}
            tasks.append(Task(task_id=f"sw-{name}-v{var}", instruction=instruction, env=self.name, goal=goal))
        return tasks

    def _load(self, name: str, variation: int, gold: bool = False) -> None:
        if self._loaded is not None and self._loaded[:2] == (name, variation) and (self._loaded[2] or not gold):
            return
        max_var = int(self._sim.get_max_variations(name))
        if not 0 <= variation < max_var:
            raise ValueError(f"scienceworld task {name!r}: variation {variation} not in [0, {max_var})")
        self._sim.load(name, variation, self.simplification, generateGoldPath=gold)
        self._loaded = (name, variation, gold)

    # -- episode ----------------------------------------------------------------------------------
    def _reset(self, task: Task | None, split: str) -> tuple[str, dict[str, Any]]:
        if task is None:
            raise ValueError("scienceworld env: reset needs a task (none given and the split has none)")
        name, variation = self._goal_of(task)
        self._load(name, variation)
        self._sim.server.reset()
        self.task, self._done, self._score = task, False, 0.0
        return self._observe("", reward=0.0)

    def _goal_of(self, task: Task) -> tuple[str, int]:
        try:
            return str(task.goal["task_name"]), int(task.goal["variation"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"scienceworld task {task.task_id!r}: goal needs task_name and variation") from None

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        command = " ".join(action.split())
        if self._done or not command:
            return self._invalid()
        server = self._sim.server
        reply = str(server.step(command))
        if reply.startswith(INVALID_REPLY):
            return self._invalid()
        ambiguous = reply.startswith(AMBIGUOUS_REPLY)
        if ambiguous:  # ScienceWorld waits for a number: take its first reading
            reply = str(server.step("0"))
        score = float(server.getScore())
        terminated = bool(server.getCompleted()) or score < 0
        self._done, self._score = terminated, score
        reward = min(1.0, max(0.0, score)) if terminated else 0.0
        obs, info = self._observe(reply, reward=reward)
        info["success"] = terminated and score >= 1.0
        info["ambiguous_resolved"] = ambiguous
        return obs, reward, terminated, info

    def _observe(self, feedback: str, reward: float) -> tuple[str, dict[str, Any]]:
        server = self._sim.server
        room = parse_look(str(server.freeActionLook()))
        inventory = parse_inventory(str(server.freeActionInventory()))
        if self._done:
            actions: list[str] = []
        else:
            actions = derived_actions(room, inventory)
            if self.admissible:
                actions = verified_actions(actions, server.getValidActionObjectCombinations())
            actions = actions[: self.max_actions]
        obs = abstract_state(room, inventory, feedback or "You look around.", actions, self.max_text)
        info: dict[str, Any] = {"admissible_actions": actions, "invalid_action": False, "success": False,
                                "reward": reward, "score": max(0.0, self._score), "location": room.location}
        return obs, info

    def _invalid(self) -> tuple[str, float, bool, dict[str, Any]]:
        """The state stays, reward 0, flagged."""
        info = {"admissible_actions": list(self._last_info.get("admissible_actions", [])), "invalid_action": True,
                "success": False, "reward": 0.0, "score": max(0.0, self._score),
                "location": self._last_info.get("location", "unknown")}
        return self._last_obs, 0.0, False, info

    # -- the expert ---------------------------------------------------------------------------------
    def gold_action_sequence(self) -> list[str]:
        """ScienceWorld's gold path for the current task (generated once per task and cached). Generating it
        reloads the task, so it is only allowed before the episode's first step."""
        if self.task is None:
            raise RuntimeError("scienceworld env: gold_action_sequence() before reset()")
        key = self._goal_of(self.task)
        if key not in self._gold:
            if self.steps > 0:
                raise RuntimeError("scienceworld env: the gold path must be generated before the first step")
            self._load(*key, gold=True)
            self._sim.server.reset()
            self._gold[key] = [str(a) for a in self._sim.get_gold_action_sequence()]
        return list(self._gold[key])

    # -- action grammar of abstract states (for the dream env) ------------------------------------
    def admissible_for_state(self, state: str) -> list[str]:
        return actions_in_state(state)

    def action_valid_for_state(self, state: str, action: str) -> bool | None:
        """True for an action the state lists; None otherwise (ScienceWorld accepts more than its menu)."""
        return True if " ".join(action.split()) in set(actions_in_state(state)) else None

    # -- shutdown ----------------------------------------------------------------------------
    def close(self) -> None:
        """Shut the JVM down and wait for it (killing it after 10 s); safe to call twice."""
        sim, self._sim = getattr(self, "_sim", None), None
        if sim is None:
            return
        _LIVE_ENVS.discard(self)
        try:
            sim.close()
        except Exception as e:  # a JVM that already died: fall through to the process check
            logger.debug("scienceworld: gateway shutdown failed: %r", e)
        sim.close = lambda: None  # its own __del__ would shut the gateway down a second time
        java = self._java
        try:
            java.wait(timeout=10)
        except Exception:
            logger.warning("scienceworld: JVM %d did not exit within 10 s; killing it", java.pid)
            java.kill()
            java.wait(timeout=10)
        super().close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: modules may already be gone
            self.close()
