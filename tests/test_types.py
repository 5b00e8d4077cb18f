"""The data model: JSONL / Parquet round trips, malformed files, torn tails, schema versions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dreamgym.types import (
    SCHEMA_VERSION,
    DataError,
    JsonlWriter,
    Task,
    Trajectory,
    Transition,
    read_jsonl,
    read_parquet,
    read_trajectories,
    write_trajectories,
)


def make_traj(i: int, success: bool = True) -> Trajectory:
    task = Task(task_id=f"t{i}", instruction=f"buy item {i}", goal={"asin": f"B{i:05d}", "price": 10.5})
    trs = [
        Transition(state="[1] search: ", action=f"search[item {i}]", next_state="[1] link: B1", reward=0.0, done=False),
        Transition(
            state="[1] link: B1", action="click[buy now]", next_state="done", reward=1.0 if success else 0.25,
            done=True, info={"invalid_action": False, "nested": {"a": [1, 2]}},
        ),
    ]
    return Trajectory(task=task, transitions=trs, success=success, source="real", policy="oracle", meta={"seed": i})


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    trajs = [make_traj(i, success=i % 2 == 0) for i in range(5)]
    path = tmp_path / f"data{suffix}"
    assert write_trajectories(path, trajs) == 5
    back = list(read_trajectories(path))
    assert back == trajs
    assert back[1].total_reward == pytest.approx(0.25)
    assert back[0].num_steps == 2


def test_malformed_jsonl_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = make_traj(0).model_dump_json()
    path.write_text(good + "\n\n" + "{not json\n" + good + "\n")
    it = read_jsonl(path)
    assert next(it).task.task_id == "t0"
    with pytest.raises(DataError, match=r"bad\.jsonl:3: invalid JSON"):
        next(it)


def test_missing_field_and_wrong_type(tmp_path: Path) -> None:
    obj = json.loads(make_traj(0).model_dump_json())
    del obj["task"]["instruction"]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(obj) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:1: task\.instruction: Field required"):
        list(read_jsonl(path))
    obj = json.loads(make_traj(0).model_dump_json())
    obj["transitions"][0]["reward"] = "lots"
    path.write_text(json.dumps(obj) + "\n")
    with pytest.raises(DataError, match=r":1: transitions\.0\.reward"):
        list(read_jsonl(path))
    path.write_text("[1, 2]\n")
    with pytest.raises(DataError, match="expected a JSON object"):
        list(read_jsonl(path))


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    obj = json.loads(make_traj(0).model_dump_json())
    obj["schema_version"] = SCHEMA_VERSION + 1
    path = tmp_path / "future.jsonl"
    path.write_text(json.dumps(obj) + "\n")
    with pytest.raises(DataError, match="unsupported schema_version"):
        list(read_jsonl(path))


def test_writer_repairs_torn_tail_and_keeps_finished_records(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    with JsonlWriter(path) as w:
        w.write(make_traj(0))
        w.write(make_traj(1))
    # Simulate a writer killed in the middle of its third record.
    with path.open("a") as f:
        f.write(make_traj(2).model_dump_json()[:40])
    with JsonlWriter(path) as w:
        w.write(make_traj(3))
    ids = [t.task.task_id for t in read_jsonl(path)]
    assert ids == ["t0", "t1", "t3"]


def test_parquet_errors(tmp_path: Path) -> None:
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        list(read_parquet(bad))
    with pytest.raises(DataError, match="no such file"):
        list(read_trajectories(tmp_path / "missing.jsonl"))
