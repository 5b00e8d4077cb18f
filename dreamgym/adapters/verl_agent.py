"""Any dreamgym env, real or dream, for verl-agent (github.com/langfengQ/verl-agent).

verl-agent drives a vectorised env through an *environment manager* (its
``agent_system/environments/base.py:EnvironmentManagerBase``): ``reset(kwargs) -> (observations, infos)`` and
``step(text_actions) -> (observations, rewards, dones, infos)``, where ``observations`` is ``{"text": [...],
"image": None, "anchor": [...]}`` (``anchor``: the state alone, GiGPO's step key), every info has
``is_action_valid`` and ``won``, and ``projection_f(text_actions) -> (actions, valids)`` turns LLM outputs into
env actions. :class:`DreamgymEnvManager` is that manager over :class:`DreamgymVecEnv` (``env_num`` tasks ×
``group_n`` episodes each, one reset seed per group, so a GRPO/GiGPO group starts from one state), with the
prompt and the action parsing of :class:`~dreamgym.agent.policy.LLMPolicy`.

To use it in verl-agent, add a branch to its ``make_envs`` (``agent_system/environments/env_manager.py``) that
returns ``DreamgymEnvManager(DreamgymVecEnv("shop", ...), dreamgym_projection, config)`` for train and val. It
subclasses verl-agent's base class when verl-agent is installed and stands alone otherwise (its tests run
without verl, which needs GPUs and vLLM).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dreamgym.agent.policy import AgentObservation, PolicyConfig, build_agent_prompt, env_action
from dreamgym.envs import TextEnv, make

try:  # verl-agent's own base class when it is installed
    from agent_system.environments.base import EnvironmentManagerBase as _Base
except ImportError:  # pragma: no cover - verl-agent is a GPU stack
    _Base = object


class DreamgymVecEnv:
    """``env_num`` tasks × ``group_n`` episodes of one dreamgym env (each its own instance), reset together."""

    def __init__(self, env: str | Callable[[], TextEnv], env_num: int, group_n: int = 1, split: str = "train",
                 seed: int = 0, env_kwargs: dict[str, Any] | None = None, policy: PolicyConfig | None = None) -> None:
        factory = env if callable(env) else (lambda: make(env, **(env_kwargs or {})))
        self.envs = [factory() for _ in range(env_num * group_n)]
        self.env_num, self.group_n, self.split, self.seed = env_num, group_n, split, seed
        self.policy = policy or PolicyConfig()
        self.obs: list[str] = [""] * len(self.envs)
        self.infos: list[dict[str, Any]] = [{} for _ in self.envs]
        self.history: list[list[tuple[str, str]]] = [[] for _ in self.envs]
        self.done = [False] * len(self.envs)
        self._resets = 0

    def observation(self, i: int) -> AgentObservation:
        return AgentObservation(self.infos[i]["task"].instruction, self.obs[i],
                                self.infos[i].get("admissible_actions") or [], list(self.history[i]))

    def reset(self) -> tuple[list[str], list[dict[str, Any]]]:
        tasks = self.envs[0].tasks(self.split)
        if not tasks:
            raise ValueError(f"{self.envs[0].name}: no tasks in split {self.split!r}")
        rng = np.random.default_rng(self.seed + self._resets)
        self._resets += 1
        picked = [tasks[int(k)] for k in rng.choice(len(tasks), self.env_num, replace=len(tasks) < self.env_num)]
        for i, env in enumerate(self.envs):
            group = i // self.group_n  # one task and one reset seed per group
            self.obs[i], self.infos[i] = env.reset(seed=self.seed + 1000 * self._resets + group,
                                                   options={"task": picked[group], "split": self.split})
            self.history[i], self.done[i] = [], False
        return list(self.obs), [self._info(i) for i in range(len(self.envs))]

    def step(self, actions: Sequence[str]) -> tuple[list[str], list[float], list[bool], list[dict[str, Any]]]:
        rewards = [0.0] * len(self.envs)
        for i, (env, action) in enumerate(zip(self.envs, actions, strict=True)):
            if self.done[i]:  # verl-agent keeps stepping finished envs; they stay finished
                continue
            obs, reward, terminated, truncated, info = env.step(action)
            self.history[i].append((self.obs[i], action))
            self.obs[i], self.infos[i], rewards[i] = obs, info, float(reward)
            self.done[i] = terminated or truncated
        return list(self.obs), rewards, list(self.done), [self._info(i) for i in range(len(self.envs))]

    def _info(self, i: int) -> dict[str, Any]:
        info = self.infos[i]
        return {"won": bool(info.get("success")), "admissible_actions": list(info.get("admissible_actions") or []),
                "task_id": info["task"].task_id, "source": getattr(self.envs[i], "source", "real")}

    def close(self) -> None:
        for env in self.envs:
            env.close()


def dreamgym_projection(text_actions: Sequence[str], vec: DreamgymVecEnv) -> tuple[list[str], list[bool]]:
    """LLM outputs → env actions as :class:`~dreamgym.agent.policy.LLMPolicy` parses them (``<action>…</action>``,
    an option number in ``index`` format), and whether each parsed (an unparsed one is sent as "": invalid)."""
    actions, valids = [], []
    for i, text in enumerate(text_actions):
        answer = env_action(text, vec.observation(i), vec.policy)
        actions.append(answer or "")
        valids.append(answer is not None)
    return actions, valids


class DreamgymEnvManager(_Base):
    """verl-agent's environment manager for a :class:`DreamgymVecEnv` (see the module docstring)."""

    def __init__(self, envs: DreamgymVecEnv, projection_f: Callable[..., tuple[list[str], list[bool]]] = dreamgym_projection,
                 config: Any = None) -> None:
        self.envs, self.projection_f, self.config = envs, projection_f, config

    def reset(self, kwargs: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        obs, infos = self.envs.reset()
        return {"text": self.build_text_obs(), "image": None, "anchor": obs}, infos

    def step(self, text_actions: list[str]) -> tuple[dict[str, Any], np.ndarray, np.ndarray, list[dict[str, Any]]]:
        actions, valids = self.projection_f(text_actions, self.envs)
        obs, rewards, dones, infos = self.envs.step(actions)
        for info, valid, i in zip(infos, valids, range(len(infos)), strict=True):
            info["is_action_valid"] = np.array(valid and not self.envs.infos[i].get("invalid_action", False))
        return ({"text": self.build_text_obs(), "image": None, "anchor": obs}, np.array(rewards, dtype=np.float32),
                np.array(dones), infos)

    def build_text_obs(self) -> list[str]:
        """Each env's prompt as one text (system, then user; verl-agent applies the chat template itself)."""
        out = []
        for i in range(len(self.envs.envs)):
            messages = build_agent_prompt(self.envs.observation(i), self.envs.policy)
            out.append("\n\n".join(m["content"] for m in messages))
        return out

    def close(self) -> None:
        self.envs.close()

    def success_evaluator(self, *args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        """``success_rate`` per env: its episode's ``won`` (verl-agent's default reads the last active step)."""
        return {"success_rate": np.array([float(info.get("success", False)) for info in self.envs.infos])}
