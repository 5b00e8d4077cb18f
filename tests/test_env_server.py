"""The AgentGym-protocol env server and client, over a real loopback socket.

A tiny counting env (defined here) exercises the protocol; the ``shop`` tests check that a served shop
episode is the in-process one, step for step.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from dreamgym.envs import make, register
from dreamgym.envs.agentgym import AgentGymEnv, EnvServerError, parse_range
from dreamgym.envs.base import Element, TextEnv, format_elements
from dreamgym.envs.server import BackgroundServer, create_app
from dreamgym.types import Task

# --------------------------------------------------------------------------------------- a tiny env


class CounterEnv(TextEnv):
    """Count up to the task's target, then ``submit``: reward 1 when the count is right."""

    name = "counter"

    def __init__(self, max_steps: int = 8) -> None:
        super().__init__(max_steps=max_steps)
        self.count = 0

    def tasks(self, split: str = "train") -> list[Task]:
        targets = [1, 2, 3] if split == "train" else [4, 5]
        return [
            Task(task_id=f"{split}-{n}", instruction=f"count to {n}", env="counter", goal={"target": n})
            for n in targets
        ]

    def _obs(self) -> str:
        assert self.task is not None
        elements = [Element("1", "button", "inc"), Element("2", "button", "submit")]
        return format_elements(elements, header=f"{self.task.instruction}; count: {self.count}")

    def _reset(self, task: Task | None, split: str) -> tuple[str, dict[str, Any]]:
        self.task, self.count = task, 0
        return self._obs(), {"admissible_actions": ["inc", "submit"]}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        assert self.task is not None
        if action == "crash":
            raise RuntimeError("the env broke")
        if action == "inc":
            self.count += 1
        elif action == "submit":
            won = self.count == self.task.goal["target"]
            return "submitted", float(won), True, {"success": won}
        else:
            return self._obs(), 0.0, False, {"invalid_action": True, "admissible_actions": ["inc", "submit"]}
        return self._obs(), 0.0, False, {"admissible_actions": ["inc", "submit"]}


register("counter", CounterEnv)


def play(env: TextEnv, actions: list[str], **reset_kwargs: Any) -> list[tuple[Any, ...]]:
    """Reset then play ``actions`` until done: every (obs, reward, terminated, truncated, key info)."""
    obs, info = env.reset(**reset_kwargs)
    out: list[tuple[Any, ...]] = [(obs, info["admissible_actions"])]
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        out.append((obs, r, term, trunc, info["success"], info["invalid_action"], info["admissible_actions"]))
        if term or trunc:
            break
    return out


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with BackgroundServer(create_app("counter", max_sessions=64)) as base:
        yield base


def client(url: str, **kwargs: Any) -> AgentGymEnv:
    kwargs.setdefault("backoff", 0.01)
    kwargs.setdefault("env_name", "counter")
    return AgentGymEnv(url=url, **kwargs)


def health(url: str) -> dict[str, Any]:
    res = httpx.get(f"{url}/health", timeout=5)
    assert res.status_code == 200
    return dict(res.json())


# ------------------------------------------------------------------------------------ client <-> server


def test_parse_range() -> None:
    assert parse_range("0-3") == [0, 1, 2, 3]
    assert parse_range("7") == [7]
    assert parse_range("0-1, 5-6") == [0, 1, 5, 6]
    for bad in ("a-b", "5-2", "-3"):
        with pytest.raises(ValueError, match="bad task range"):
            parse_range(bad)


def test_tasks_come_from_the_server_listing(url: str) -> None:
    env = client(url)
    train, test = env.tasks("train"), env.tasks("test")
    assert [t.task_id for t in train] == ["counter-0", "counter-1", "counter-2"]
    assert [t.goal["data_idx"] for t in test] == [3, 4]
    assert test[0].instruction == "count to 4" and test[0].goal["server_task_id"] == "test-4"
    assert env.get_task("counter-4").goal["data_idx"] == 4
    with pytest.raises(KeyError):
        env.get_task("other-4")
    # Explicit ranges win over the listing (AgentGym servers have none).
    assert [t.goal["data_idx"] for t in client(url, train_range="1-2").tasks("train")] == [1, 2]
    env.close()


@pytest.mark.parametrize("actions", [["inc", "inc", "submit"], ["inc", "jump", "submit"], ["inc"] * 9])
def test_remote_episode_equals_in_process(url: str, actions: list[str]) -> None:
    local, remote = CounterEnv(), client(url)
    task = local.tasks("train")[1]  # count to 2 (data_idx 1)
    expected = play(local, actions, options={"task": task})
    got = play(remote, actions, options={"task": remote.tasks("train")[1]})
    assert got == expected
    assert remote.task is not None and remote.task.instruction == "count to 2"
    remote.close()


def test_fifty_concurrent_sessions_are_isolated_and_freed(url: str) -> None:
    results: dict[int, tuple[float, bool, str]] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            env = client(url)
            target = 1 + i % 3  # task i % 3 of the train split counts to this
            obs, _ = env.reset(options={"task": env.get_task(f"counter-{i % 3}")})
            assert obs.startswith(f"count to {target}; count: 0")
            for k in range(target):
                obs, *_ = env.step("inc")
                assert f"count: {k + 1}" in obs
            _, reward, terminated, _, info = env.step("submit")
            results[i] = (reward, terminated and info["success"], obs)
            env.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[0]
    assert len(results) == 50 and all(r == 1.0 and ok for r, ok, _ in results.values())
    assert health(url)["sessions"] == 0  # every closed session was freed


def test_step_after_the_episode_ended_is_refused(url: str) -> None:
    env = client(url)
    env.reset(options={"task": env.get_task("counter-0")})
    env.step("submit")
    with pytest.raises(EnvServerError, match=r"409.*has finished"):
        env.step("inc")
    env.close()


def test_server_side_step_limit_is_a_truncation() -> None:
    with BackgroundServer(create_app("counter", {"max_steps": 3})) as base:
        env = client(base, max_steps=15)
        steps = play(env, ["inc"] * 5, options={"task": env.get_task("counter-2")})
        assert len(steps) == 4 and steps[-1][2:4] == (False, True)  # not terminated, truncated
        env.close()


# ------------------------------------------------------------------------------------ bad requests


def test_bad_requests_get_4xx_and_the_server_keeps_serving(url: str) -> None:
    h = httpx.Client(base_url=url, timeout=5)
    sid = h.post("/create").json()["id"]

    def check(res: httpx.Response, status: int, words: str) -> None:
        assert res.status_code == status, res.text
        assert words in res.json()["error"]
        assert health(url)["status"] == "ok"

    check(h.post("/step", json={"id": sid, "action": "inc"}), 409, "not been reset")
    check(
        h.post("/step", content=b"{not json", headers={"content-type": "application/json"}), 400, "malformed"
    )
    check(h.post("/step", json={"id": 10_000, "action": "inc"}), 404, "unknown env id 10000")
    check(h.post("/step", json={"id": sid}), 422, "action")
    check(h.post("/step", json={"action": "inc"}), 422, "missing the session")
    check(h.post("/reset", json={"id": sid, "data_idx": 99}), 404, "task index 99 out of range")
    check(h.post("/reset", json={"id": sid, "task_id": "nope"}), 404, "unknown task id")
    check(h.post("/reset", json={"id": sid, "split": "valid"}), 422, "split")
    check(h.post("/reset", json={"id": sid, "seed": -1}), 422, "seed")
    check(h.post("/step", content=b"x" * (2 << 20)), 413, "request body over")
    check(h.get("/observation", params={"id": "abc"}), 422, "id")
    assert h.post("/reset", json={"id": sid, "data_idx": 0}).status_code == 200
    check(h.post("/step", json={"id": sid, "action": "crash"}), 500, "RuntimeError: the env broke")
    # The session that crashed still answers, and a fresh episode plays normally.
    assert h.post("/reset", json={"id": sid, "data_idx": 0}).json()["observation"].startswith("count to 1")
    assert h.post("/step", json={"id": sid, "action": "inc"}).json()["done"] is False
    assert h.post("/close", json={"id": sid}).json() == {"closed": True}
    check(h.post("/close", json={"id": sid}), 404, "unknown env id")
    h.close()


def test_session_cap_and_idle_eviction() -> None:
    # The cap, with sessions that never idle out while the client backs off (on a loaded machine its retries
    # took longer than a short idle timeout, which freed a slot and let them succeed).
    with BackgroundServer(create_app("counter", max_sessions=2, idle_timeout_s=600)) as base:
        h = httpx.Client(base_url=base, timeout=5)
        for _ in range(2):
            assert h.post("/create").status_code == 200
        res = h.post("/create")
        assert res.status_code == 503 and "session cap (2)" in res.json()["error"]
        assert res.headers["retry-after"] == "1"
        # The client retries a 503 with backoff, then says why in one line.
        with pytest.raises(EnvServerError, match=r"after 2 attempts \(503 server is at its session cap"):
            client(base, retries=1).reset(
                options={"task": Task(task_id="x", instruction="", goal={"data_idx": 0})}
            )
        h.close()
    # Eviction: idle 2 s; the sleeps leave `first` idle 2.4 s and `second` 1.2 s, margins a loaded machine keeps.
    with BackgroundServer(create_app("counter", max_sessions=2, idle_timeout_s=2.0)) as base:
        h = httpx.Client(base_url=base, timeout=5)
        first, second = h.post("/create").json()["id"], h.post("/create").json()["id"]
        h.post("/reset", json={"id": second, "data_idx": 0})
        time.sleep(1.2)
        h.get("/observation", params={"id": second})  # keeps `second` alive
        time.sleep(1.2)
        third = h.post("/create").json()["id"]  # `first` was idle past the timeout: evicted, freeing a slot
        assert h.get("/observation", params={"id": first}).status_code == 404
        assert h.get("/observation", params={"id": second}).status_code == 200
        assert h.get("/list_envs").json() == [second, third]
        h.close()


def test_client_error_when_the_server_is_down() -> None:
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = client(f"http://127.0.0.1:{port}", retries=2, train_range="0-3")
    task = env.tasks("train")[0]
    start = time.monotonic()
    with pytest.raises(EnvServerError) as err:
        env.reset(options={"task": task})
    message = str(err.value)
    assert "\n" not in message
    assert f"POST http://127.0.0.1:{port}/create failed after 3 attempts (ConnectError" in message
    assert time.monotonic() - start < 5
    env.close()  # nothing to release, and no error


# ------------------------------------------------------------------------------ AgentGym's dialects


def test_webshop_dialect_for_agentgym_webshop_clients(url: str) -> None:
    """What ``agentenv``'s WebshopEnvClient sends and reads, at ``/webshop``."""
    h = httpx.Client(base_url=f"{url}/webshop", timeout=5)
    env_idx = h.post("/create").json()
    assert isinstance(env_idx, int)
    obs, none = h.post("/reset", json={"env_idx": env_idx, "session_id": 2}).json()
    assert obs.startswith("count to 3") and none is None
    assert h.get("/observation", params={"env_idx": env_idx}).json() == obs
    assert h.get("/instruction_text", params={"env_idx": env_idx}).json() == "count to 3"
    assert h.get("/available_actions", params={"env_idx": env_idx}).json() == {
        "has_search_bar": False,
        "clickables": [],
    }
    step = h.post("/step", json={"env_idx": env_idx, "action": "inc"}).json()
    assert step["state"].endswith("count: 1\n[1] button: inc\n[2] button: submit") and step["done"] is False
    assert h.post("/close", json={"env_idx": env_idx}).json() == {"closed": True}
    h.close()
    # Our client plays the WebShop dialect too (bare-int create, [obs, null] reset).
    env = client(f"{url}/webshop")
    assert play(env, ["inc", "submit"], options={"task": env.get_task("counter-0")})[-1][1:5] == (
        1.0,
        True,
        False,
        True,
    )
    env.close()


def sciworld_like_app() -> FastAPI:
    """The shape of AgentGym's SciWorld server (agentenv-sciworld/server.py): ``id`` bodies, errors as 200
    ``{"error"}``, a cumulative ``score``, ``task_description`` apart, no /available_actions, no /close."""
    app = FastAPI()
    state: dict[int, dict[str, Any]] = {}

    @app.post("/create")
    def create() -> dict[str, int]:
        state[len(state)] = {"score": 0, "done": False}
        return {"id": len(state) - 1}

    @app.post("/reset")
    def reset(body: dict[str, Any]) -> dict[str, Any]:
        state[body["id"]] = {"score": 0, "done": False}
        return {
            "task_description": f"Task {body['data_idx']}: boil water.",
            "observation": "You are in a kitchen.",
        }

    @app.post("/step")
    def step(body: dict[str, Any]) -> dict[str, Any]:
        s = state[body["id"]]
        if s["done"]:
            return {"error": f"The task with environment {body['id']} has finished."}
        gain = 50 if body["action"] in ("heat water", "focus on water") else 0
        s["score"] += gain
        s["done"] = s["score"] >= 100
        return {
            "observation": f"You did: {body['action']}",
            "reward": gain,
            "score": s["score"],
            "done": s["done"],
        }

    return app


def test_client_plays_an_agentgym_style_server() -> None:
    with BackgroundServer(sciworld_like_app()) as base:
        env = client(base, env_name="sciworld", train_range="0-9", reward_scale=0.01)
        obs, info = env.reset(options={"task": "sciworld-7"})
        assert obs == "You are in a kitchen."
        assert info["admissible_actions"] == [] and info["task"].instruction == "Task 7: boil water."
        steps = play(env, ["look", "heat water", "focus on water"], options={"task": "sciworld-7"})
        assert [s[1] for s in steps[1:]] == [0.0, 0.5, 0.5]
        assert steps[-1][2:5] == (True, False, True)  # terminated, not truncated, success (return 1.0)
        with pytest.raises(EnvServerError, match="error: The task with environment 0 has finished"):
            env.step("look")
        env.close()  # the server has no /close: tolerated


# ----------------------------------------------------------------------------------------------- CLI


def test_cli_serve_rejects_an_unknown_env() -> None:
    from typer.testing import CliRunner

    from dreamgym.cli.env import env_app

    result = CliRunner().invoke(env_app, ["serve", "no-such-env", "--port", "0"])
    assert result.exit_code != 0 and "unknown env 'no-such-env'" in str(result.exception)


# ---------------------------------------------------------------------------------------------- shop


SHOP_SEEDS = range(5)


@pytest.fixture(scope="module")
def shop_episodes() -> list[tuple[Task, int, list[str], list[tuple[Any, ...]]]]:
    """Oracle episodes of the shop played in process: (task, seed, actions, everything observed)."""
    env = make("shop")
    policy = env.scripted_policy("oracle")
    out = []
    for seed in SHOP_SEEDS:
        task = env.tasks("test")[seed]
        obs, info = env.reset(seed=seed, options={"task": task})
        policy.reset(env, task)
        actions = []
        while True:
            actions.append(policy.act(obs, info))
            obs, _, terminated, truncated, info = env.step(actions[-1])
            if terminated or truncated:
                break
        out.append((task, seed, actions, play(env, actions, seed=seed, options={"task": task})))
    return out


@pytest.fixture(scope="module")
def shop_url() -> Iterator[str]:
    with BackgroundServer(create_app("shop", max_sessions=64)) as base:
        yield base


def remote_task(env: AgentGymEnv, task: Task) -> Task:
    """The served env's task for an in-process shop task (the listing maps indices to shop task ids)."""
    return next(t for t in env.tasks("test") if t.goal["server_task_id"] == task.task_id)


def test_shop_oracle_episode_over_http_equals_in_process(shop_url: str, shop_episodes: list[Any]) -> None:
    env = client(shop_url, env_name="shop")
    for task, seed, actions, expected in shop_episodes:
        got = play(env, actions, seed=seed, options={"task": remote_task(env, task)})
        assert got == expected
        assert got[-1][1] == 1.0 and got[-1][4] is True  # the oracle bought the right thing
        assert env.task is not None and env.task.instruction == task.instruction
    env.close()


def test_shop_fifty_concurrent_sessions(shop_url: str, shop_episodes: list[Any]) -> None:
    mismatches: list[str] = []

    def worker(i: int) -> None:
        task, seed, actions, expected = shop_episodes[i % len(shop_episodes)]
        try:
            env = client(shop_url, env_name="shop")
            if play(env, actions, seed=seed, options={"task": remote_task(env, task)}) != expected:
                mismatches.append(f"session {i}: episode differs")
            env.close()
        except Exception as e:
            mismatches.append(f"session {i}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not mismatches, mismatches[:3]
    assert health(shop_url)["sessions"] == 0


def test_cli_serves_the_shop(tmp_path: Any) -> None:
    """``dreamgym env serve shop`` in a subprocess: it binds, plays an episode step and shuts down."""
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-c", "from dreamgym.cli import main; main()", "env", "serve", "shop"]
    cmd += ["--port", str(port), "--env-arg", "num_products=200", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).json()["env"] == "shop":
                    break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.2)
        env = client(url, env_name="shop")
        obs, info = env.reset(seed=0, options={"task": env.tasks("test")[0]})
        assert "search[" in obs and info["admissible_actions"]
        _, _, _, _, info = env.step(info["admissible_actions"][0])
        assert info["invalid_action"] is False and info["page"] == "results"
        env.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_gymnasium_make_of_a_served_env_passes_gymnasiums_checker(shop_url: str) -> None:
    from conftest import gym_check

    gym_check("agentgym", url=shop_url, env_name="shop")


def test_sessions_expire_by_default_and_an_api_key_guards_every_route(monkeypatch: pytest.MonkeyPatch) -> None:
    from dreamgym.envs.server import DEFAULT_IDLE_TIMEOUT_S

    assert create_app("counter").state.store.idle_timeout_s == DEFAULT_IDLE_TIMEOUT_S > 0
    with BackgroundServer(create_app("counter", api_key="s3cret")) as base:
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200  # open, for health checks
        assert httpx.post(f"{base}/create", json={}, timeout=5).status_code == 401
        bad = httpx.post(f"{base}/create", json={}, headers={"Authorization": "Bearer nope"}, timeout=5)
        assert bad.status_code == 401 and "API key" in bad.text
        monkeypatch.setenv("DG_ENV_KEY", "s3cret")
        env = make("agentgym", url=base, env_name="counter", backoff=0.01, api_key_env="DG_ENV_KEY")
        obs, _ = env.reset(seed=0)
        assert obs and env.make_kwargs["api_key_env"] == "DG_ENV_KEY" and "s3cret" not in str(env.make_kwargs)
        env.close()
        monkeypatch.delenv("DG_ENV_KEY")
        with pytest.raises(ValueError, match="DG_ENV_KEY"):
            client(base, api_key_env="DG_ENV_KEY")
