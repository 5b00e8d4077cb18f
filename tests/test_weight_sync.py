"""Rollouts from ``dreamgym serve`` with weight sync (``RLConfig.rollout_server``): after every update the
trainer pushes its weights and the next rollouts' log-probs are the in-process model's; a rollout generated
under older weights is refused in one line; a reload with a wrong key is a 401, a corrupt one a 4xx that leaves
the old weights served; the SGLang request shapes go where its docs say."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi import FastAPI, Request

from dreamgym.agent.policy import PolicyConfig, load_policy, save_policy
from dreamgym.baselines.sft import bc_examples, init_model
from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.llm import LLMConfig, SamplingParams
from dreamgym.llm.hf import HFLLM
from dreamgym.llm.openai_backend import OpenAILLM
from dreamgym.llm.serve import BackgroundServer, ServerLimits, create_app
from dreamgym.rl.trainer import RLConfig, train
from dreamgym.rl.weight_sync import RolloutServer, StaleRollout, WeightSync, push_request

torch.set_num_threads(1)

SHOP: dict[str, Any] = {"num_products": 100, "num_tasks_per_split": 2}
KEY = "sync-test-key"


@pytest.fixture(scope="module")
def policy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained micro policy (numbered actions, short answers): enough for log-probs to compare."""
    env = make("shop", **SHOP)
    trajs = list(iter_episodes(env, env.scripted_policy("oracle"), 2, seed=0))
    cfg = PolicyConfig(max_new_tokens=6, action_format="index")
    model, tokenizer = init_model("micro", trajs, bc_examples(trajs, cfg), vocab_size=1024, seed=0)
    run = tmp_path_factory.mktemp("policy") / "run"
    save_policy(run, model, tokenizer, cfg)
    return run


@pytest.fixture()
def server(policy_run: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[BackgroundServer, HFLLM]]:
    """``dreamgym serve`` of the policy's initial weights, with an API key (load_weights needs one)."""
    monkeypatch.setenv("DG_SYNC_KEY", KEY)
    served = HFLLM.from_pretrained(policy_run / "model", max_batch_size=16)
    with BackgroundServer(create_app(served, "micro", api_key=KEY, limits=ServerLimits(max_batch=16))) as s:
        yield s, served


def rl_config(policy_run: Path, url: str, **overrides: Any) -> RLConfig:
    base: dict[str, Any] = {
        "init": str(policy_run), "env": "shop", "env_kwargs": SHOP, "iterations": 2, "tasks_per_iter": 2,
        "group_size": 2, "max_steps": 3, "lr": 1e-2, "entropy_coef": 0.05, "minibatch_size": 1000,
        "micro_batch_size": 8, "eval_episodes": 0, "save_every": 1, "num_threads": 1, "save_rollouts": False,
        "rollout_server": {"base_url": url, "model": "micro", "api_key_env": "DG_SYNC_KEY"},
    }
    return RLConfig.model_validate({**base, **overrides})


def test_served_rollouts_use_the_weights_pushed_after_each_update(policy_run: Path, server: Any,
                                                                   tmp_path: Path) -> None:
    """trainer → save → reload → the next rollouts' log-probs are the in-process model's (the learner's
    ``logp_behaviour_gap``: |in-process − served| log-prob over every trained token, before the step)."""
    s, served = server
    before = {k: v.clone() for k, v in served.model.state_dict().items()}
    train(rl_config(policy_run, s.url), tmp_path / "run")
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # version 1: the initial push; each update pushes the next, and iteration 2 rolled out under version 2
    assert [m["weight_version"] for m in metrics] == [2, 3]
    for m in metrics:
        assert m["logp_behaviour_gap"] < 1e-4, m  # the served log-probs are the trainer's model's
    assert not list((tmp_path / "run" / "sync").glob("step_1"))  # only the served weights are kept
    trained = load_policy(tmp_path / "run")
    after = served.model.state_dict()
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-3  # the update moved the weights
    for k, v in trained.llm.model.state_dict().items():  # type: ignore[attr-defined]
        torch.testing.assert_close(after[k], v)  # and the server holds the trainer's last ones
    # the same prompt, served and in process, after the reload: equal log-probs
    remote = OpenAILLM(LLMConfig(backend="openai", model="micro", base_url=s.url, api_key_env="DG_SYNC_KEY"))
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3, logprobs=True)
    got = remote.generate(["TASK: buy a red shirt"], params)[0]
    want = trained.llm.generate(["TASK: buy a red shirt"], params)[0]
    remote.close()
    assert got.token_ids == want.token_ids and got.weight_version == 3
    assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)


def test_a_rollout_under_older_weights_is_refused(policy_run: Path, server: Any, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload that never reached the server (here: skipped) leaves it serving an older version than the
    trainer pushed: the next rollout is refused with one line, before any update trains on it."""
    s, _ = server
    real_push = WeightSync._push
    calls: list[int] = []

    def lost_after_first(self: WeightSync) -> int:
        calls.append(1)
        return real_push(self) if len(calls) == 1 else (self.version or 0) + 1  # the reload is lost

    monkeypatch.setattr(WeightSync, "_push", lost_after_first)
    with pytest.raises(StaleRollout) as e:
        train(rl_config(policy_run, s.url), tmp_path / "run")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("iteration 2: rollout generated under weight version 1, the trainer pushed version 2")


def test_load_weights_refuses_a_wrong_key_and_a_corrupt_dir(policy_run: Path, server: Any, tmp_path: Path) -> None:
    s, served = server
    weights = tmp_path / "w"
    served.model.save_pretrained(weights, safe_serialization=True)
    wrong = httpx.post(f"{s.url}/load_weights", json={"path": str(weights)}, headers={"Authorization": "Bearer no"})
    assert wrong.status_code == 401
    remote = OpenAILLM(LLMConfig(backend="openai", model="micro", base_url=s.url, api_key_env="DG_SYNC_KEY"))
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0, logprobs=True)
    first = remote.generate(["TASK: buy"], greedy)[0]
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    data = (weights / "model.safetensors").read_bytes()
    (corrupt / "model.safetensors").write_bytes(data[: len(data) // 2])  # a copy cut in the middle
    bad = httpx.post(f"{s.url}/load_weights", json={"path": str(corrupt)}, headers={"Authorization": f"Bearer {KEY}"},
                     timeout=60)
    assert 400 <= bad.status_code < 500 and "unreadable safetensors" in bad.json()["error"]["message"]
    again = remote.generate(["TASK: buy"], greedy)[0]
    remote.close()
    assert again.weight_version == first.weight_version == 0
    assert again.token_ids == first.token_ids and again.logprobs == pytest.approx(first.logprobs, abs=1e-6)


def test_sglang_sync_requests_follow_its_native_api(policy_run: Path, tmp_path: Path) -> None:
    """SGLang (not installed here): the push goes to ``/update_weights_from_disk`` at the server root with the
    model dir (config, weights, tokenizer) and the next version, read back from ``/get_model_info``."""
    seen: list[dict[str, Any]] = []
    app = FastAPI()
    state = {"version": "7"}

    @app.get("/get_model_info")
    async def info() -> dict[str, Any]:
        return {"model_path": "m", "weight_version": state["version"]}

    @app.post("/update_weights_from_disk")
    async def update(request: Request) -> dict[str, Any]:
        body = await request.json()
        seen.append(body)
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in Path(body["model_path"]).iterdir()}
        state["version"] = body["weight_version"]
        return {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

    with BackgroundServer(app) as s:
        sync = WeightSync(load_policy(policy_run), RolloutServer(base_url=s.url, model="m", sync="sglang"), tmp_path)
        assert sync.push()["weight_version"] == 8
        assert seen[0]["weight_version"] == "8" and Path(seen[0]["model_path"]).is_absolute()
        assert sync.served_version() == 8
        sync.close()


def test_request_shapes_and_the_vllm_lora_refusal() -> None:
    vllm = RolloutServer(base_url="http://h:8000/v1", model="qwen", sync="vllm_lora")
    assert push_request(vllm, "/w", 3) == ("http://h:8000/v1/load_lora_adapter", {"lora_name": "qwen-v3", "lora_path": "/w"})
    ours = RolloutServer(base_url="http://h:8000/v1/", model="m")
    assert push_request(ours, "/w", 2) == ("http://h:8000/v1/load_weights", {"path": "/w", "version": 2})
    with pytest.raises(ValueError, match="vllm_lora loads LoRA adapters"):
        RLConfig.model_validate({"rollout_server": vllm.model_dump()})


def test_dreamgym_train_cli_takes_a_rollout_server(policy_run: Path, server: Any, tmp_path: Path) -> None:
    """The README's ``dreamgym train --set 'rollout_server={...}'`` form."""
    from typer.testing import CliRunner

    from dreamgym.cli import app

    s, _ = server
    out = tmp_path / "run"
    args = ["train", "--env", "shop", "--algo", "grpo", "--init", str(policy_run), "--out", str(out),
            "--env-arg", "num_products=100", "--env-arg", "num_tasks_per_split=2",
            "--set", f'rollout_server={{base_url: "{s.url}", model: micro, api_key_env: DG_SYNC_KEY}}',
            "--set", "iterations=1", "--set", "tasks_per_iter=1", "--set", "group_size=2", "--set", "max_steps=2",
            "--set", "eval_episodes=0", "--set", "num_threads=1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output[-2000:]
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["weight_version"] == 2 and metrics["logp_behaviour_gap"] < 1e-4
