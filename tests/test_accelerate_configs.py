"""configs/accelerate/*.yaml load with accelerate's own config reader and name the engine the README says (a
parse check only: the DDP launch itself is run by tests/test_distributed.py; FSDP and ZeRO are not run)."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "accelerate"


@pytest.mark.parametrize(("name", "engine"), [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"), ("zero2", "DEEPSPEED")])
def test_accelerate_config_loads(name: str, engine: str) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
    assert str(cfg.distributed_type).endswith(engine) and cfg.num_machines == 1
    if name == "zero2":
        assert cfg.deepspeed_config["zero_stage"] == 2


def test_ddp_config_file_launches_two_cpu_ranks(tmp_path: Path) -> None:
    """The README's `accelerate launch --config_file configs/accelerate/ddp.yaml -m dreamgym train ...` on a
    machine without GPUs: 2 ranks over gloo (about 15 s on 2 cores)."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from dreamgym.agent.policy import PolicyConfig, save_policy
    from dreamgym.baselines.sft import bc_examples, init_model
    from dreamgym.collect import iter_episodes
    from dreamgym.envs import make

    env = make("shop", num_products=100, num_tasks_per_split=4)
    trajs = list(iter_episodes(env, env.scripted_policy("oracle"), 2, seed=0))
    cfg = PolicyConfig(max_new_tokens=8, action_format="index")
    model, tokenizer = init_model("micro", trajs, bc_examples(trajs, cfg), vocab_size=1024, seed=0)
    save_policy(tmp_path / "policy", model, tokenizer, cfg)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = CONFIGS.parent.parent
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "ddp.yaml"),
           "--main_process_port", str(port), "-m", "dreamgym", "train", "--env", "shop", "--env-arg",
           "num_products=100", "--env-arg", "num_tasks_per_split=4", "--init", str(tmp_path / "policy"), "--out",
           str(tmp_path / "run"), "--set", "tasks_per_iter=2", "--set", "group_size=2", "--set", "max_steps=3",
           "--set", "eval_episodes=0", "--set", "num_threads=1", "--set", "iterations=1"]
    env_vars = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=root, env=env_vars, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["iterations"] == 1
