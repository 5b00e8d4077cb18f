"""The `dreamgym` command end to end in a subprocess: exit codes, one-line errors, collect/eval output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dreamgym.types import read_jsonl


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dreamgym", *args], capture_output=True, text=True, timeout=300)


def test_malformed_data_file_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": 3}\n')
    r = run("collect", "--env", "shop", "--policy", "random", "--episodes", "1", "--out", str(bad),
            "--env-arg", "num_products=100")
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "bad.jsonl:1" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_bad_arguments_exit_2() -> None:
    r = run("eval", "--env", "no-such-env")
    assert r.returncode == 2 and "unknown env" in r.stderr and "Traceback" not in r.stderr
    r = run("eval", "--env", "shop", "--env-arg", "novalue")
    assert r.returncode == 2 and "key=value" in r.stderr


def test_collect_resumes_and_eval_prints_json(tmp_path: Path) -> None:
    out = tmp_path / "d.jsonl"
    args = ["collect", "--env", "shop", "--policy", "oracle", "--split", "train", "--seed", "3",
            "--out", str(out), "--env-arg", "num_products=100"]
    assert run(*args, "--episodes", "4").returncode == 0
    r = run(*args, "--episodes", "6")  # continues: only 2 more episodes
    assert r.returncode == 0, r.stderr
    trajs = list(read_jsonl(out))
    assert [t.meta["seed"] for t in trajs] == [3, 4, 5, 6, 7, 8]
    r = run("eval", "--env", "shop", "--policy", "oracle", "--episodes", "5", "--json", "--env-arg", "num_products=100")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["episodes"] == 5 and {"success_rate", "mean_reward", "mean_steps"} <= res.keys()
