"""Helpers shared by the env test modules."""

from __future__ import annotations

import os
import shutil
import warnings
from typing import Any


def pytest_configure(config: Any) -> None:
    """Under pytest-xdist (``make test``), each worker's torch uses one thread: the workers share the cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def chromium_path() -> str | None:
    """The system Chromium on PATH (the browser tests skip without one), or None."""
    for name in ("chromium", "chromium-browser"):
        if found := shutil.which(name):
            return found
    return None


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


def clone_oracle_policy(out: Any, **shop: Any) -> Any:
    """A micro policy that has memorised the shop oracle's first train episode greedily, but not when sampling (so
    the episodes of a group differ and GRPO has a signal), saved as a policy dir at ``out``. Cloned with a plain
    full-batch loop: the steps of ``train_bc`` without the Trainer's start-up time."""
    import torch

    from dreamgym.agent.policy import PolicyConfig, save_policy
    from dreamgym.baselines.sft import bc_examples, init_model
    from dreamgym.collect import iter_episodes
    from dreamgym.envs import make
    from dreamgym.sft import MaskedCollator, tokenize_example

    env = make("shop", **shop)
    trajs = list(iter_episodes(env, env.scripted_policy("oracle"), 1, seed=0))
    policy_cfg = PolicyConfig(max_new_tokens=16)
    examples = bc_examples(trajs, policy_cfg)
    model, tokenizer = init_model("micro", trajs, examples, vocab_size=1024, seed=0)
    rows = [tokenize_example(tokenizer, ex, max_length=1024) for ex in examples]
    batch = MaskedCollator(tokenizer.pad_token_id)([r for r in rows if r is not None])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(60):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    save_policy(out, model, tokenizer, policy_cfg)
    return out
