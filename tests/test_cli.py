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
    r = run("eval", "--env", "shop", "--policy", "oracle", "--decoding", "beam")
    assert r.returncode == 2 and "--decoding 'beam': free or admissible" in r.stderr and "Traceback" not in r.stderr


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


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    """The single error line of a user error (exit 2, no traceback; a progress bar may precede it)."""
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-2000:]
    return lines[0]


def test_split_is_train_val_or_test(tmp_path: Path) -> None:
    """--split takes val; an unknown split, or the shop's val while it is off, is a one-line error."""
    line = one_line_error(run("eval", "--env", "shop", "--split", "dev", "--episodes", "1"))
    assert "unknown split 'dev'" in line and "train | val | test" in line, line
    line = one_line_error(run("collect", "--env", "shop", "--split", "valid", "--out", str(tmp_path / "x.jsonl")))
    assert "unknown split 'valid'" in line, line
    line = one_line_error(run("eval", "--env", "shop", "--split", "val", "--episodes", "1", "--env-arg", "num_products=100"))
    assert "val_fraction" in line, line
    r = run("eval", "--env", "shop", "--policy", "oracle", "--split", "val", "--episodes", "3", "--json",
            "--env-arg", "num_products=100", "--env-arg", "val_fraction=0.1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["split"] == "val"
    line = one_line_error(run("train", "--env", "shop", "--out", str(tmp_path / "r"), "--set", "eval_split=dev"))
    assert "eval_split" in line and "'val'" in line, line
    assert "train | val | test" in run("eval", "--help").stdout


def test_config_errors_name_the_field_at_fault(tmp_path: Path) -> None:
    """Every config's validation error says which field and why, not just "1 validation error for X"."""
    line = one_line_error(run("train", "--env", "shop", "--out", str(tmp_path / "r"), "--set", "iterations=abc"))
    assert "RLConfig" in line and "iterations" in line and "integer" in line, line
    line = one_line_error(run("demo", "--out", str(tmp_path / "d"), "--set", "dream_iterations=[1"))
    assert "YAML" in line, line
    line = one_line_error(run("demo", "--out", str(tmp_path / "d"), "--set", "dream_iterations=many"))
    assert "dream_iterations" in line, line
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("sft:\n  epochs: lots\n")
    data = tmp_path / "a.jsonl"
    data.write_text("")
    line = one_line_error(run("train-exp", "--data", str(data), "--out", str(tmp_path / "e"), "--config", str(cfg)))
    assert "epochs" in line and "number" in line, line


def test_bad_yaml_bad_bytes_and_directories_are_one_line_errors_naming_file_and_line(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("iterations: 3\nlr: [1e-4\n")
    line = one_line_error(run("train", "--config", str(bad_yaml), "--out", str(tmp_path / "r")))
    assert "bad.yaml:" in line and "invalid YAML" in line, line
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"iterations: 3\nname: caf\xe9\n")
    line = one_line_error(run("train", "--config", str(latin), "--out", str(tmp_path / "r")))
    assert "latin.yaml:2" in line and "UTF-8" in line, line
    line = one_line_error(run("train", "--config", str(tmp_path), "--out", str(tmp_path / "r")))
    assert "directory" in line, line
    # trajectory files: a non-UTF-8 line and a directory, for every command that reads --data
    data = tmp_path / "d.jsonl"
    data.write_bytes(b'\n\xff\xfe{"task": 1}\n')
    for args in (["annotate", "--annotator", "rule", "--data", str(data), "--out", str(tmp_path / "a.jsonl")],
                 ["buffer", "build", "--data", str(data), "--out", str(tmp_path / "b")]):
        line = one_line_error(run(*args))
        assert "d.jsonl:2" in line and "UTF-8" in line, (args, line)
        line = one_line_error(run(*[str(tmp_path) if a == str(data) else a for a in args]))
        assert "directory" in line, (args, line)


def test_collect_checks_out_before_playing_and_resumes_from_a_torn_line(tmp_path: Path) -> None:
    line = one_line_error(run("collect", "--env", "shop", "--episodes", "3", "--out", str(tmp_path),
                              "--env-arg", "num_products=100"))
    assert "is a directory" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no stray partial output
    out = tmp_path / "d.jsonl"
    args = ["collect", "--env", "shop", "--policy", "oracle", "--seed", "0", "--out", str(out),
            "--env-arg", "num_products=100"]
    assert run(*args, "--episodes", "3").returncode == 0
    with out.open("ab") as f:  # a killed writer's torn last line
        f.write(b'{"traj_id": "half')
    r = run(*args, "--episodes", "5")
    assert r.returncode == 0, r.stderr[-2000:]
    trajs = list(read_jsonl(out))
    assert len(trajs) == 5 and len({t.meta["seed"] for t in trajs}) == 5


def test_a_broken_policy_dir_is_a_one_line_error_naming_the_file(tmp_path: Path) -> None:
    import shutil

    from dreamgym.llm.pretrained import ASSET_DIR

    def eval_policy(d: Path) -> str:
        return one_line_error(run("eval", "--env", "shop", "--policy", str(d), "--episodes", "1",
                                  "--env-arg", "num_products=100"))

    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no config.json" in eval_policy(empty)
    bad_config = tmp_path / "bad_config"
    shutil.copytree(ASSET_DIR, bad_config)
    (bad_config / "config.json").write_text("{not json")
    line = eval_policy(bad_config)
    assert "config.json" in line and "JSON" in line, line
    truncated = tmp_path / "truncated"
    shutil.copytree(ASSET_DIR, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line = eval_policy(truncated)
    assert "model.safetensors" in line and "truncated" in line, line
    no_weights = tmp_path / "no_weights"
    shutil.copytree(ASSET_DIR, no_weights)
    (no_weights / "model.safetensors").unlink()
    assert "no model weights" in eval_policy(no_weights)
