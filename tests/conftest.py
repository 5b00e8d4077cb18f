"""Helpers shared by the env test modules."""

from __future__ import annotations

import warnings
from typing import Any


def gym_check(name: str, **kwargs: Any) -> None:
    """``gymnasium.make("dreamgym/<name>-v0", render_mode="ansi", **kwargs)`` passes Gymnasium's own checker,
    renders the observation as text, and records its kwargs so a trajectory can rebuild the env."""
    import gymnasium
    from gymnasium.utils.env_checker import check_env

    env = gymnasium.make(f"dreamgym/{name}-v0", render_mode="ansi", **kwargs)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*render fps.*")  # a text env has no frame rate
            check_env(env.unwrapped)
        assert env.unwrapped.make_kwargs == kwargs
        obs, _ = env.reset(seed=0)
        assert env.render() == obs
    finally:
        env.close()
    plain = gymnasium.make(f"dreamgym/{name}-v0", **kwargs)  # without render_mode too
    try:
        check_env(plain.unwrapped)
    finally:
        plain.close()
