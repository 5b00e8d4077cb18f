"""Data-parallel RL through accelerate (dreamgym.rl.distributed), on the CPU with gloo and the micro policy:

* 2 ranks fed the two halves of a global batch end one update with the parameters 1 process reaches on that
  batch (GRPO with the KL to the reference, PPO with its critic);
* ``accelerate launch`` of ``dreamgym train`` on 2 ranks finishes 2 iterations with ``world_size: 2`` and the
  real-transition count summed exactly over the ranks' ``env.step`` calls;
* its checkpoint resumes on 1 process (another world size), which says so;
* a rank that dies ends the whole run with a one-line error naming that rank.

The launches are those of the README's "Distributed training (accelerate)" section (``--multi_gpu`` is the
launcher's multi-process mode; without a GPU the ranks run on the CPU over gloo).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import clone_oracle_policy
from rich.console import Console

from dreamgym.agent.policy import load_policy
from dreamgym.envs import load_plugins
from dreamgym.envs.pool import LocalEnvPool, env_factory
from dreamgym.rl.batch import turn_rows
from dreamgym.rl.distributed import Dist
from dreamgym.rl.learner import Learner
from dreamgym.rl.rollout import collect_rollouts
from dreamgym.rl.trainer import RLConfig, train

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / "tests" / "distributed_envs.py"  # rank-counting-shop, loaded by every rank with --import
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The micro policy cloned on the oracle's train episode (as tests/test_trainer.py's), so sampled episodes
    differ and rows have real behaviour log-probs."""
    return clone_oracle_policy(tmp_path_factory.mktemp("bc") / "policy", num_products=100, num_tasks_per_split=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(args: list[str], tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``accelerate launch ... -m dreamgym train ...`` on 2 CPU ranks, from the repo root."""
    cmd = [*ACCELERATE, "--main_process_port", str(_free_port()), "-m", "dreamgym", "train", "--import", str(ENVS),
           *args]
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(cmd, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=240)


# ---- 1. one update: 2 ranks == 1 process on the same global batch

CONFIGS = {
    "grpo+kl": {"algo": "grpo", "kl_coef": 0.1, "loss_agg": "token-mean"},
    "ppo": {"algo": "ppo", "loss_agg": "seq-mean-token-mean", "ppo_epochs": 2},
}


def _config(policy_dir: Path, name: str) -> RLConfig:
    return RLConfig.model_validate({"init": str(policy_dir), "lr": 1e-3, "minibatch_size": 8, "micro_batch_size": 1,
                                    "group_size": 2, **CONFIGS[name]})


def _update_on_rank(policy_dir: str, name: str, rows_path: str, out: str) -> None:
    """One rank of the 2-process update (forked by accelerate's debug_launcher): its contiguous half of the rows."""
    from accelerate import Accelerator

    dist = Dist(Accelerator(cpu=True))
    torch.set_num_threads(1)  # after the Accelerator, which sets its own default
    rows = pickle.loads(Path(rows_path).read_bytes())
    lo, hi = dist.shard(len(rows))
    learner = Learner(load_policy(policy_dir), _config(Path(policy_dir), name), dist=dist)
    learner.update(rows[lo:hi], np.random.default_rng(0))
    if dist.is_main:
        torch.save({k: v.detach().clone() for k, v in learner.model.state_dict().items()}, out)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_two_ranks_update_the_parameters_as_one_process_does(
    policy_dir: Path, tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelerate import debug_launcher

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # 2 ranks x accelerate's default of 2 threads would oversubscribe

    policy = load_policy(policy_dir)
    pool = LocalEnvPool(env_factory("shop", num_products=100, num_tasks_per_split=4), 8)
    episodes = collect_rollouts(pool, policy, pool.tasks("train")[:4], group_size=2, max_steps=3, seed=0)
    rows = turn_rows(episodes)
    rng = np.random.default_rng(1)
    for row in rows:  # non-zero advantages everywhere (an untrained group may have equal returns)
        row.advantage, row.old_value, row.ret = rng.normal(), rng.normal(), rng.normal()
    assert len(rows) >= 17  # several minibatches of 8, some with all their rows on one rank
    rows_path = tmp_path / "rows.pkl"
    rows_path.write_bytes(pickle.dumps(rows))

    learner = Learner(load_policy(policy_dir), _config(policy_dir, name))
    before = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
    learner.update(rows, np.random.default_rng(0))
    one = learner.model.state_dict()
    debug_launcher(_update_on_rank, args=(str(policy_dir), name, str(rows_path), str(tmp_path / "two.pt")),
                   num_processes=2)
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    moved = max((one[k] - before[k]).abs().max().item() for k in one)
    diff = max((one[k] - two[k]).abs().max().item() for k in one)
    print(f"{name}: largest parameter change {moved:.2e}, largest 1-vs-2-process difference {diff:.2e}")
    assert moved > 1e-3
    assert diff < 1e-5


# ---- 2-4. accelerate launch -m dreamgym train on 2 ranks

TRAIN = ["--init", "POLICY", "--env", "rank-counting-shop", "--env-arg", "num_products=100",
         "--env-arg", "num_tasks_per_split=4", "--set", "tasks_per_iter=3", "--set", "group_size=2",
         "--set", "max_steps=4", "--set", "eval_episodes=0", "--set", "num_threads=1",
         "--set", "micro_batch_size=4", "--set", "minibatch_size=8"]


def _train_args(policy_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["--out", str(out), *[str(policy_dir) if a == "POLICY" else a for a in TRAIN], *extra]


def test_two_ranks_train_count_every_rank_and_resume_on_one(policy_dir: Path, tmp_path: Path) -> None:
    run, steps = tmp_path / "run", tmp_path / "steps"
    steps.mkdir()
    done = _launch(_train_args(policy_dir, run, "--set", "iterations=2"), tmp_path, DREAMGYM_STEP_DIR=str(steps))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    per_rank = {p.name: json.loads(p.read_text()) for p in steps.iterdir()}
    assert set(per_rank) == {"rank0.json", "rank1.json"} and all(per_rank.values())  # both ranks stepped
    assert summary["world_size"] == 2 and summary["iterations"] == 2
    assert summary["real_transitions"] == sum(per_rank.values())
    assert summary["train_episodes"] == 2 * 3 * 2  # iterations x tasks x group: every rank's episodes
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [1, 2]  # rank 0 alone logs
    rollouts = [json.loads(line) for line in (run / "rollouts" / "iter_00002.jsonl").read_text().splitlines()]
    assert len(rollouts) == 3 * 2  # every rank's episodes, gathered

    # resume with another world size: 1 process continues the 2-process checkpoint and says so
    load_plugins([str(ENVS)])
    out = io.StringIO()
    cfg = RLConfig.model_validate({**yaml.safe_load((run / "config.yaml").read_text()), "iterations": 3})
    resumed = train(cfg, run, resume=True, console=Console(file=out, width=400))
    assert "with world_size 1; it was saved with world_size 2" in out.getvalue()
    third = [json.loads(line) for line in (run / "rollouts" / "iter_00003.jsonl").read_text().splitlines()]
    assert resumed["world_size"] == 1 and resumed["iterations"] == 3
    assert resumed["real_transitions"] == summary["real_transitions"] + sum(len(t["transitions"]) for t in third)


def test_a_rank_that_dies_fails_the_run_naming_it(policy_dir: Path, tmp_path: Path) -> None:
    done = _launch(_train_args(policy_dir, tmp_path / "run", "--set", "iterations=1"), tmp_path,
                   DREAMGYM_FAIL_RANK="1")
    assert done.returncode != 0
    named = [ln for ln in done.stderr.splitlines() if ln.startswith("error: rank 1 of 2:")]
    assert named == ["error: rank 1 of 2: RuntimeError: the env of this rank broke"], done.stderr[-3000:]
    assert not (tmp_path / "run" / "summary.json").exists()
