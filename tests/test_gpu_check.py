"""benchmarks/gpu_check.py's CPU mode (``--device cpu --quick``: fp32, tiny sizes) runs every check and writes
its JSON. It is not a test of the GPU (CI has none): it keeps the script from rotting between GPU runs. About 11 s
on 2 busy cores; skipped when it would not fit the 20 s this test may take."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_quick_cpu_mode_passes_every_check(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--quick", "--out",
                               str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.skip("gpu_check --quick took over 20 s on this machine")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["ok"] and result["command"].startswith("python benchmarks/gpu_check.py --device cpu --quick")
    assert set(result["checks"]) == {"hf_generate", "train_exp", "rl_trainer", "distributed_update", "dream"}
    assert result["machine"]["device"] == "cpu" and result["dtype"] == "float32"
    dist = result["checks"]["distributed_update"]
    assert dist["backend"] == "gloo" and dist["world_size"] == 1
    assert dist["max_param_diff_vs_plain"] < 1e-6 < dist["max_param_change"]
    assert {"1", "4", "8"} <= set(result["checks"]["dream"])
    assert time.monotonic() - t0 < 20
