"""The generalised pipeline end to end on TextWorld (`dreamgym demo --config configs/textworld-tiny.yaml`,
micro-sized): every stage runs, DreamGym uses 0 real transitions, the RL rows >0, and the plot and the
fidelity report exist."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("textworld", reason="the textworld extra is not installed: pip install 'dreamgym[textworld]'")

# The repo's config, shrunk: 3 train / 2 test games (generated once into the shared game cache), a handful of
# episodes, one RL iteration of 2 tasks x 2 rollouts, one epoch of each SFT.
MICRO = {
    "env_kwargs": {"num_train_games": 3, "num_test_games": 2, "max_steps": 8, "max_commands": 16, "max_text": 150},
    "offline_episodes": 12, "eval_episodes": 2, "heldout_episodes": 2, "max_steps": 6, "eval_num_envs": 2,
    "exp_model": "micro",
    "exp_sft": {"epochs": 1, "learning_rate": 3e-3, "batch_size": 16, "num_threads": 1},
    "sft": {"epochs": 1, "learning_rate": 3e-3, "batch_size": 16, "num_threads": 1},
    "rl": {"iterations": 1, "tasks_per_iter": 2, "group_size": 2, "eval_every": 0, "num_threads": 1,
           "max_steps": 4, "minibatch_size": 32},
    "dream": {"task_generator": "none", "synthetic_share": 0.0, "max_new_tokens": 48},
    "dream_iterations": 1,
    "s2r_share": 1.0,  # the S2R budget is strict: 10% of GRPO's ~16 transitions is less than one group (2 x 4)
}


def test_textworld_demo_end_to_end(tmp_path: Path) -> None:
    config = yaml.safe_load(Path("configs/textworld-tiny.yaml").read_text())
    (tmp_path / "tw.yaml").write_text(yaml.safe_dump({**config, **MICRO}))
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "dreamgym", "demo", "--config", str(tmp_path / "tw.yaml"),
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    table = json.loads((out / "table.json").read_text())
    assert table["env"] == "textworld"
    rows = {row["method"]: row for row in table["rows"]}
    assert list(rows) == ["SFT", "GRPO (real)", "DreamGym", "DreamGym-S2R"]
    assert all(0.0 <= row["success_rate"] <= 1.0 for row in rows.values())
    assert rows["DreamGym"]["real_transitions"] == 0  # trained in the dream only
    assert rows["GRPO (real)"]["real_transitions"] > 0 and rows["DreamGym-S2R"]["real_transitions"] > 0
    assert json.loads((out / "dreamgym" / "summary.json").read_text())["synthetic_transitions"] > 0
    assert (out / "success_vs_real.png").stat().st_size > 1000
    # no task generator for TextWorld (task_generator none), but GRPO's group variances are logged and plotted
    assert (out / "curriculum_variance.png").stat().st_size > 1000
    # every offline step got a rule trace, and the fidelity stage scored held-out test-game transitions
    annotation = json.loads((out / "stages" / "annotate.json").read_text())
    assert annotation["written"] == 12 and annotation["fallbacks"] == 0
    assert table["fidelity"]["transitions"] > 0 and (out / "fidelity.json").exists()
    assert "8/8 DreamGym-S2R: continue in the real textworld" in r.stderr and "shop" not in r.stderr
