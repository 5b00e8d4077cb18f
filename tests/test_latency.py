"""The real-env cost model (issue 13, item 5): a LatencyEnv sleeps per reset/step with at most N sessions at
once, a LocalEnvPool batch of B such envs takes about ceil(B/N)·S, envs without latency are untouched, and
the flags reach RLConfig from the CLI with one-line errors for bad values."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dreamgym.envs import TextEnv
from dreamgym.envs.latency import LatencyEnv, with_latency
from dreamgym.envs.pool import LocalEnvPool
from dreamgym.types import Task


class Counter(TextEnv):
    """A tiny env: the observation is the step count; the episode ends after 3 steps."""

    name = "counter"

    def _reset(self, task: Task | None, split: str) -> tuple[str, dict[str, Any]]:
        self.task = task or Task(task_id="c0", instruction="count")
        return "0", {"admissible_actions": ["inc"]}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        return str(self.steps), 1.0, self.steps >= 3, {"admissible_actions": ["inc"], "success": self.steps >= 3}


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.monotonic()
    out = fn()
    return time.monotonic() - t0, out


def test_a_batch_of_8_envs_with_4_sessions_takes_two_latencies_not_eight() -> None:
    pool = LocalEnvPool(with_latency(Counter, 0.2, 4), 8)
    try:
        task = Task(task_id="c0", instruction="count")
        reset_s, resets = timed(lambda: pool.reset_batch(range(8), [task] * 8, list(range(8)), "train"))
        step_s, steps = timed(lambda: pool.step_batch(range(8), ["inc"] * 8))
        print(f"8 envs, 4 sessions, 0.2 s: reset batch {reset_s:.3f} s, step batch {step_s:.3f} s")
        for seconds in (reset_s, step_s):
            assert 0.39 <= seconds < 0.9, seconds  # ceil(8/4)·0.2 = 0.4, not 8·0.2 = 1.6
        assert [obs for obs, _ in resets] == ["0"] * 8 and [r.obs for r in steps] == ["1"] * 8  # in slot order
        assert all(env.charged_s == pytest.approx(0.4) for env in pool.envs)  # one reset + one step each
    finally:
        pool.close()


def test_one_session_steps_the_batch_one_after_the_other() -> None:
    pool = LocalEnvPool(with_latency(Counter, 0.05, 1), 4)
    try:
        pool.reset_batch(range(4), [Task(task_id="c0", instruction="count")] * 4, [0] * 4, "train")
        seconds, _ = timed(lambda: pool.step_batch(range(4), ["inc"] * 4))
        assert seconds >= 0.2, seconds
    finally:
        pool.close()


def test_without_latency_the_env_and_the_pool_are_untouched() -> None:
    assert with_latency(Counter, 0.0, 4) is Counter
    pool = LocalEnvPool(Counter, 3)
    assert pool._threads is None and type(pool.envs[0]) is Counter
    env = LatencyEnv(Counter(), 0.0, 2)  # a zero latency wrapper still behaves like the env
    obs, info = env.reset(seed=0)
    assert obs == "0" and env.task is not None and env.name == "counter" and env.source == "real"
    assert env.step("inc")[:3] == ("1", 1.0, False) and env.steps == 1 and env.charged_s == 0.0
    pool.close()


def test_negative_latency_or_no_session_is_a_one_line_error() -> None:
    from dreamgym.rl.config import RLConfig

    with pytest.raises(ValueError, match=r"latency must be >= 0 seconds, got -0.1$"):
        with_latency(Counter, -0.1, 1)
    with pytest.raises(ValueError, match=r"sessions must be >= 1, got 0$"):
        LatencyEnv(Counter(), 0.1, 0)
    with pytest.raises(ValueError, match="real_latency_s"):
        RLConfig(real_latency_s=-1.0)
    with pytest.raises(ValueError, match="real_sessions"):
        RLConfig(real_sessions=0)
    with pytest.raises(ValueError, match="env_backend=local"):
        RLConfig(real_latency_s=0.1, env_backend="ray")


def test_the_cli_flags_reach_rlconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dreamgym.rl.trainer as trainer
    from dreamgym.cli import app, describe

    seen: list[Any] = []

    def fake_train(cfg: Any, out: Path, resume: bool = False, console: Any = None) -> dict[str, Any]:
        seen.append(cfg)
        return dict.fromkeys(("algo", "iterations", "real_transitions", "eval_transitions", "success_rate",
                              "mean_reward", "eval_episodes"))

    monkeypatch.setattr(trainer, "train", fake_train)
    args = ["train", "--env", "shop", "--out", str(tmp_path / "r")]
    r = CliRunner().invoke(app, [*args, "--real-latency", "0.25", "--real-sessions", "3"])
    assert r.exit_code == 0, r.output
    assert (seen[-1].real_latency_s, seen[-1].real_sessions, seen[-1].real_latency_eval) == (0.25, 3, False)
    assert CliRunner().invoke(app, args).exit_code == 0
    assert (seen[-1].real_latency_s, seen[-1].real_sessions) == (0.0, 1)  # the defaults: off
    r = CliRunner().invoke(app, [*args, "--real-latency", "-1"])
    assert r.exit_code != 0 and "\n" not in describe(r.exception).strip()
    assert "real_latency_s" in describe(r.exception) and "greater than or equal to 0" in describe(r.exception)
    r = CliRunner().invoke(app, [*args, "--real-sessions", "0"])
    assert r.exit_code != 0 and "real_sessions" in describe(r.exception)


def test_open_pools_charges_training_and_exempts_evaluation_unless_asked() -> None:
    from dreamgym.rl.config import RLConfig, open_pools

    base = {"env_kwargs": {"num_products": 100, "num_tasks_per_split": 1}, "tasks_per_iter": 1, "group_size": 2}
    pool, eval_pool = open_pools(RLConfig(**base, real_latency_s=0.01, real_sessions=2))
    assert isinstance(pool.envs[0], LatencyEnv) and eval_pool is not pool  # type: ignore[attr-defined]
    assert not isinstance(eval_pool.envs[0], LatencyEnv)  # type: ignore[union-attr]
    pool.close()
    eval_pool.close()  # type: ignore[union-attr]
    pool, eval_pool = open_pools(RLConfig(**base, real_latency_s=0.01, real_latency_eval=True))
    assert eval_pool is pool and isinstance(pool.envs[0], LatencyEnv)  # type: ignore[attr-defined]
    pool.close()
    pool, eval_pool = open_pools(RLConfig(**base))  # no latency: one plain pool, as before
    assert eval_pool is pool and not isinstance(pool.envs[0], LatencyEnv)  # type: ignore[attr-defined]
    pool.close()
