"""DreamGym training: the same trainer rolls out in the dream (0 real transitions, evaluation in the real env),
writes synthetic transitions back to the replay buffer, saves the curriculum's task set, and resumes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dreamgym.agent.policy import PolicyConfig, save_policy
from dreamgym.baselines.sft import bc_examples, init_model
from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.experience.model import ExperienceConfig, save_experience_config
from dreamgym.llm.tiny import init_tiny_model
from dreamgym.replay import ReplayBuffer
from dreamgym.rl.trainer import RLConfig, train
from dreamgym.sft import MaskedCollator, tokenize_example
from dreamgym.types import read_jsonl, read_trajectories, write_jsonl

torch.set_num_threads(1)
SHOP = {"num_products": 100}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dream")
    env = make("shop", **SHOP)
    trajs = list(iter_episodes(env, env.scripted_policy("noisy", seed=0), 12, seed=0))
    write_jsonl(root / "offline.jsonl", trajs)
    # An (untrained) micro experience model: its outputs exercise the counted failure path of the dream.
    init_tiny_model("micro", [root / "offline.jsonl"], root / "exp", seed=0)
    save_experience_config(root / "exp", ExperienceConfig(max_new_tokens=16, max_resamples=0, protocol={"k": 1}))
    policy_cfg = PolicyConfig(max_new_tokens=8, action_format="index", offer_task_search=True)
    examples = bc_examples(trajs, policy_cfg)
    model, tokenizer = init_model("micro", trajs, examples, vocab_size=512, seed=0)
    # A few full-batch steps of behaviour cloning, so that the policy mostly takes valid actions (option 1,
    # "search[<instruction>]", on the search page) and the dream's experience model gets asked.
    rows = [r for r in (tokenize_example(tokenizer, ex, max_length=1024) for ex in examples) if r is not None]
    batch = MaskedCollator(tokenizer.pad_token_id)(rows)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(40):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    save_policy(root / "policy", model, tokenizer, policy_cfg)
    return {"root": root, "offline": root / "offline.jsonl", "exp": root / "exp", "policy": root / "policy"}


def dream_cfg(setup: dict[str, Path], **kw: object) -> RLConfig:
    return RLConfig.model_validate({
        "init": str(setup["policy"]), "env": "shop", "env_kwargs": SHOP, "iterations": 2, "tasks_per_iter": 2,
        "group_size": 2, "max_steps": 3, "eval_episodes": 4, "eval_every": 0, "minibatch_size": 16,
        "num_threads": 1, "save_every": 1,
        "dream": {"experience_model": str(setup["exp"]), "buffer": str(setup["root"] / "buffer"),
                  "offline_data": [str(setup["offline"])], "task_generator": "rule"},
        **kw,
    })


def test_dream_training_uses_no_real_transitions_and_feeds_the_buffer(setup: dict[str, Path]) -> None:
    run = setup["root"] / "run"
    summary = train(dream_cfg(setup), run)
    assert summary["real_transitions"] == 0
    assert summary["synthetic_transitions"] > 0
    assert summary["eval_transitions"] > 0 and summary["success_rate"] is not None  # evaluated in the real shop
    assert summary["experience_model"]["ok"] + summary["experience_model"]["failed"] > 0
    assert (run / "tasks.jsonl").exists() and (run / "model" / "model.safetensors").exists()
    buffer = ReplayBuffer.open(setup["root"] / "buffer", read_only=True)
    stats = buffer.stats()
    assert stats.by_source.get("real", 0) > 0  # seeded with the offline data
    assert set(stats.by_iteration) >= {-1}  # offline rows; synthetic rows carry their iteration
    assert sum(n for it, n in stats.by_iteration.items() if it >= 1) == stats.by_source.get("synthetic", 0)
    buffer.close()
    rollouts = [json.loads(x) for x in (run / "rollouts" / "iter_00001.jsonl").read_text().splitlines()]
    assert rollouts and all(t["source"] == "synthetic" for t in rollouts)


def test_dream_run_resumes_with_its_task_set(setup: dict[str, Path]) -> None:
    run = setup["root"] / "run2"
    train(dream_cfg(setup, iterations=1), run)
    summary = train(dream_cfg(setup, iterations=2), run, resume=True)
    assert summary["iterations"] == 2 and summary["real_transitions"] == 0
    assert len((run / "tasks.jsonl").read_text().splitlines()) >= 1


# The child trains for real; the patch only makes it stop (and report) in the middle of iteration 2, after the
# dream wrote that iteration's synthetic transitions to the replay buffer, so that the SIGKILL lands there.
CHILD = """
import json, sys, time
from pathlib import Path
import torch
import dreamgym.rl.trainer as trainer
torch.set_num_threads(1)
cfg, run, ready = trainer.RLConfig.model_validate_json(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
real_advantages = trainer.grpo_advantages
def advantages_then_hang(episodes, *args, **kwargs):
    if (run / "metrics.jsonl").exists():  # iteration 1 is done and checkpointed: this is iteration 2
        ready.write_text("killed in iteration 2")
        time.sleep(600)
    return real_advantages(episodes, *args, **kwargs)
trainer.grpo_advantages = advantages_then_hang
trainer.train(cfg, run)
"""


def test_dream_run_killed_mid_iteration_resumes_as_if_never_killed(setup: dict[str, Path]) -> None:
    root = setup["root"]

    def cfg(name: str) -> RLConfig:
        c = dream_cfg(setup, iterations=3, save_rollouts=True)
        assert c.dream is not None
        return c.model_copy(update={"dream": c.dream.model_copy(update={"buffer": str(root / f"buffer-{name}")})})

    straight = train(cfg("straight"), root / "straight")
    killed, ready = root / "killed", root / "ready"
    child = subprocess.Popen([sys.executable, "-c", CHILD, cfg("killed").model_dump_json(), str(killed), str(ready)])
    try:
        deadline = time.monotonic() + 300
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), f"the child did not reach iteration 2 (exit code {child.poll()})"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    state = json.loads((killed / "checkpoint" / "state.json").read_text())
    assert state["iteration"] == 1
    with ReplayBuffer.open(root / "buffer-killed", read_only=True) as buf:
        assert len(buf) > state["buffer_rows"]  # the killed iteration 2 wrote synthetic rows after the checkpoint

    resumed = train(cfg("killed"), killed, resume=True)
    assert resumed["iterations"] == 3 and resumed["real_transitions"] == 0
    assert resumed["synthetic_transitions"] == straight["synthetic_transitions"]
    for it in (2, 3):  # the same batches as the run that was never killed
        a, b = (read_jsonl(run / "rollouts" / f"iter_{it:05d}.jsonl") for run in (root / "straight", killed))
        assert [[(x.action, x.next_state, x.reward) for x in t.transitions] for t in a] == \
            [[(x.action, x.next_state, x.reward) for x in t.transitions] for t in b]
    a, b = (load_file(str(run / "model" / "model.safetensors")) for run in (root / "straight", killed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    with ReplayBuffer.open(root / "buffer-straight", read_only=True) as s, \
            ReplayBuffer.open(root / "buffer-killed", read_only=True) as k:
        keys = [{buf.record(r).key() for r in range(len(buf))} for buf in (s, k)]
        assert keys[0] == keys[1]  # nothing lost; the orphan rows are copies of what the resumed run redid


def test_cli_s2r_budget_continues_the_dream_run_in_the_real_env(setup: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from dreamgym.cli import app

    out = setup["root"] / "s2r_run"
    (setup["root"] / "dream.yaml").write_text(dream_cfg(setup, iterations=1).model_dump_json())  # JSON is YAML
    args = ["train", "--config", str(setup["root"] / "dream.yaml"), "--out", str(out), "--s2r-budget", "3"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    dream, s2r = (json.loads(line) for line in r.stdout.strip().splitlines()[-2:])
    assert dream["real_transitions"] == 0 and "phase" not in dream
    # the real phase starts from the dream policy and stops at the first iteration that reaches the budget
    assert s2r["phase"] == "s2r" and 3 <= s2r["real_transitions"] <= 3 + 2 * 3
    saved = json.loads((out / "s2r" / "summary.json").read_text())
    assert saved["real_transitions"] == s2r["real_transitions"]
    config = (out / "s2r" / "config.yaml").read_text()
    assert f"init: {out}" in config and "dream: null" in config
    again = CliRunner().invoke(app, [*args, "--resume"])  # both phases are done: resuming retrains nothing
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout.strip().splitlines()[-1])["real_transitions"] == s2r["real_transitions"]
    bad = CliRunner().invoke(app, ["train", "--env", "shop", "--out", str(setup["root"] / "x"), "--s2r-budget", "3"])
    assert bad.exit_code != 0 and "needs `dream`" in bad.output


def test_dream_config_overrides_the_served_experience_config(setup: dict[str, Path], tmp_path: Path) -> None:
    """``DreamConfig``'s serving overrides (the demo's ``dream``) reach the loaded M_exp; unset, experience.json's."""
    from dreamgym.experience.dream import DreamConfig, load_dream

    base = {"experience_model": str(setup["exp"]), "offline_data": [str(setup["offline"])]}
    model, env, _ = load_dream(DreamConfig(**base, buffer=str(tmp_path / "b1")), "shop", SHOP)
    assert not model.cfg.unique_elements and model.cfg.temperature == 0.0
    env.close()
    model, env, _ = load_dream(DreamConfig(**base, buffer=str(tmp_path / "b2"), unique_elements=True,
                                           temperature=0.3), "shop", SHOP)
    assert model.cfg.unique_elements and model.cfg.temperature == 0.3 and model.cfg.max_new_tokens == 16
    assert model.recall is None and "recalled" not in model.stats_dict()
    env.close()
    model, env, _ = load_dream(DreamConfig(**base, buffer=str(tmp_path / "b3"), recall=True), "shop", SHOP)
    steps = sum(len(t.transitions) for t in read_trajectories(setup["offline"]))
    assert model.recall is not None and 0 < len(model.recall) <= steps and model.stats_dict()["recalled"] == 0
    env.close()
