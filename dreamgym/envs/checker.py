"""``check_env``: does an environment honour the dreamgym text-env contract?

The same check runs on the real shop, on remote AgentGym envs and on the dream env (an environment
is an environment), and users can run it on their own: ``dreamgym.envs.checker.check_env(env)``.
It raises :class:`EnvContractError` naming the first broken promise.
"""

from __future__ import annotations

import random
from typing import Any

from dreamgym.envs.base import TextEnv
from dreamgym.types import Task

REQUIRED_INFO = ("admissible_actions", "success", "invalid_action", "no_effect", "task")
BAD_ACTIONS = ("", "definitely not an action", "click[", "search]", "click[\x00]", "x" * 5000)


class EnvContractError(AssertionError):
    pass


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise EnvContractError(msg)


def _check_step_output(out: Any, where: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
    _require(isinstance(out, tuple) and len(out) == 5, f"{where}: step() must return a 5-tuple")
    obs, reward, terminated, truncated, info = out
    _require(isinstance(obs, str), f"{where}: observation must be str, got {type(obs).__name__}")
    _require(isinstance(reward, float), f"{where}: reward must be float, got {type(reward).__name__}")
    _require(isinstance(terminated, bool) and isinstance(truncated, bool), f"{where}: terminated/truncated must be bool")
    _check_info(info, where)
    return obs, reward, terminated, truncated, info


def _check_info(info: Any, where: str) -> None:
    _require(isinstance(info, dict), f"{where}: info must be a dict")
    for key in REQUIRED_INFO:
        _require(key in info, f"{where}: info lacks {key!r}")
    _require(isinstance(info["admissible_actions"], list), f"{where}: info['admissible_actions'] must be a list")
    _require(isinstance(info["task"], Task), f"{where}: info['task'] must be a Task")


def check_env(env: TextEnv, episodes: int = 3, seed: int = 0, split: str = "train", max_steps: int = 100) -> None:
    """Play ``episodes`` random episodes plus invalid actions and check every promise of the contract."""
    rng = random.Random(seed)
    for ep in range(episodes):
        obs, info = env.reset(seed=seed + ep, options={"split": split})
        _require(isinstance(obs, str) and obs != "", "reset(): observation must be a non-empty str")
        _check_info(info, "reset()")
        task = info["task"]
        _require(env.task == task, "reset(): env.task must be the task in info['task']")

        # Invalid actions never raise: state unchanged, reward 0, flag set, episode not ended.
        for bad in BAD_ACTIONS:
            if bad in info["admissible_actions"]:
                continue
            b_obs, b_rew, b_term, _b_trunc, b_info = _check_step_output(env.step(bad), f"step({bad[:20]!r})")
            _require(b_info["invalid_action"] is True, f"step({bad[:20]!r}): info['invalid_action'] must be True")
            _require(b_rew == 0.0, f"step({bad[:20]!r}): an invalid action must give reward 0")
            _require(b_obs == obs, f"step({bad[:20]!r}): an invalid action must leave the state unchanged")
            _require(not b_term, f"step({bad[:20]!r}): an invalid action must not terminate the episode")
        # Determinism: the same seed and task give the same first observation.
        obs, info = env.reset(seed=seed + ep, options={"task": task})
        obs2, _ = env.reset(seed=seed + ep, options={"task": task})
        _require(obs == obs2, "reset(): same seed and task must give the same observation")

        for t in range(max_steps):
            actions = info["admissible_actions"]
            _require(len(actions) > 0, f"step {t}: a live episode must offer admissible actions")
            action = rng.choice(actions)
            obs, reward, terminated, truncated, info = _check_step_output(env.step(action), f"step({action!r})")
            _require(not info["invalid_action"], f"step({action!r}): an admissible action was flagged invalid")
            _require(0.0 <= reward <= 1.0, f"step({action!r}): reward {reward} outside [0, 1]")
            if info["success"]:
                _require(terminated, "info['success'] may only be True when the episode terminates")
            if terminated or truncated:
                break
        else:
            raise EnvContractError(f"episode did not end within {max_steps} steps (max_steps={env.max_steps})")
