"""The data model: tasks, transitions and trajectories, and their on-disk forms; and the plain records that
envs and the experience model share (:class:`Explanation`, :class:`ExperiencePrediction`).

A trajectory is stored as one JSON object per line (JSONL) or one row per trajectory in Parquet. Both carry
``SCHEMA_VERSION``; a reader refuses a newer version with a clear error instead of guessing.
Every reader error names ``file:line`` (or ``file:row``) and the reason, so that a CLI can print it in one line.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA_VERSION = 1
log = logging.getLogger(__name__)

Source = Literal["real", "synthetic"]


class DataError(ValueError):
    """A data file (or a record in it) is malformed. The message is one line: ``path:line: reason``."""


class Task(BaseModel):
    """A task τ: an instruction plus whatever the environment needs to score it (``goal``)."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    instruction: str
    env: str = "shop"
    goal: dict[str, Any] = Field(default_factory=dict)
    # "seed": from the environment's own task set; "synthetic": written by the curriculum task generator.
    origin: Literal["seed", "synthetic"] = "seed"
    parent_id: str | None = None


class Transition(BaseModel):
    """One step (s_t, a_t, s_{t+1}, r_{t+1}, done) in the abstract textual state space."""

    model_config = ConfigDict(extra="forbid")

    state: str
    action: str
    next_state: str
    reward: float
    done: bool
    info: dict[str, Any] = Field(default_factory=dict)


class Trajectory(BaseModel):
    """A whole episode of one task, from a real environment or from the dream (experience model)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    traj_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    task: Task
    transitions: list[Transition] = Field(default_factory=list)
    success: bool = False
    source: Source = "real"
    policy: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.transitions))

    @property
    def num_steps(self) -> int:
        return len(self.transitions)


# ---------------------------------------------------------------------------------------------- JSONL


def _check_version(version: Any, where: str) -> None:
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise DataError(f"{where}: unsupported schema_version {version!r} (this dreamgym reads 1..{SCHEMA_VERSION})")


def first_error(err: ValidationError) -> str:
    """``loc: message (+N more)`` of a pydantic error: the field at fault and why, in one line."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"]) or "<record>"
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{loc}: {e['msg']}{more}"


def parse_trajectory(line: str, where: str) -> Trajectory:
    """Parse one JSONL line; raise :class:`DataError` naming ``where`` (``file:line``) on any problem."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    _check_version(obj.get("schema_version", SCHEMA_VERSION), where)
    try:
        return Trajectory.model_validate(obj)
    except ValidationError as e:
        raise DataError(f"{where}: {first_error(e)}") from None


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    """Yield the trajectories of a JSONL file. Blank lines are skipped; anything else malformed raises."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    if p.is_dir():
        raise DataError(f"{p}: is a directory, not a trajectory file")
    with p.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{p}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
            if line.strip():
                yield parse_trajectory(line, f"{p}:{lineno}")


def read_yaml_mapping(path: str | os.PathLike[str], what: str = "config") -> dict[str, Any]:
    """The mapping in a YAML file (empty file: ``{}``). Every problem is a one-line :class:`DataError` naming
    the file (and the line, for bad bytes or bad YAML): missing, a directory, not UTF-8, invalid YAML, or not a
    mapping. The one loader of every YAML config (RL, demo, M_exp training, LLM)."""
    import yaml

    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such {what} file")
    if p.is_dir():
        raise DataError(f"{p}: is a directory, not a {what} file")
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"{p}:{line}: not UTF-8 (byte 0x{raw[e.start]:02x})") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        reason = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise DataError(f"{where}: invalid YAML ({reason})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise DataError(f"{p}: a {what} file must hold a mapping of fields, not {type(loaded).__name__}")
    return loaded


def _repair_torn_tail(p: Path) -> None:
    """If a previous writer was killed mid-line, cut the torn last line so appends start on a fresh line."""
    size = p.stat().st_size
    if size == 0:
        return
    with p.open("rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        # Walk back to the last newline (files are line-oriented; a torn line is at most one record).
        pos, chunk = size, 1 << 16
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start)
            i = buf.rfind(b"\n")
            if i >= 0:
                cut = start + i + 1
                break
            pos = start
        else:
            cut = 0
        log.warning("%s: dropping a torn last line (%d bytes) left by an interrupted writer", p, size - cut)
        f.truncate(cut)


class JsonlWriter:
    """Appends trajectories to a JSONL file, one ``write`` + flush + fsync per record.

    A kill at any moment loses at most the record being written; the next writer cuts its torn tail.
    """

    def __init__(self, path: str | os.PathLike[str], append: bool = True, fsync: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if append and self.path.exists():
            _repair_torn_tail(self.path)
        self._f = self.path.open("a" if append else "w", encoding="utf-8")
        self._fsync = fsync
        self.count = 0

    def write(self, traj: Trajectory) -> None:
        self._f.write(traj.model_dump_json() + "\n")
        self._f.flush()
        if self._fsync:
            os.fsync(self._f.fileno())
        self.count += 1

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_jsonl(path: str | os.PathLike[str], trajs: Iterable[Trajectory], append: bool = False) -> int:
    with JsonlWriter(path, append=append, fsync=False) as w:
        for t in trajs:
            w.write(t)
        os.fsync(w._f.fileno())
        return w.count


# -------------------------------------------------------------------------------------------- Parquet
# One row per trajectory. Nested task/transitions become Arrow structs/lists; free-form dicts (goal, info,
# meta) are JSON strings because their keys differ between environments.


def _to_row(t: Trajectory) -> dict[str, Any]:
    return {
        "schema_version": t.schema_version,
        "traj_id": t.traj_id,
        "task_id": t.task.task_id,
        "task_json": t.task.model_dump_json(),
        "success": t.success,
        "source": t.source,
        "policy": t.policy,
        "meta_json": json.dumps(t.meta),
        "transitions": [
            {
                "state": x.state,
                "action": x.action,
                "next_state": x.next_state,
                "reward": x.reward,
                "done": x.done,
                "info_json": json.dumps(x.info),
            }
            for x in t.transitions
        ],
    }


def write_parquet(path: str | os.PathLike[str], trajs: Iterable[Trajectory]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_to_row(t) for t in trajs]
    table = pa.Table.from_pylist(rows).replace_schema_metadata({"dreamgym_schema_version": str(SCHEMA_VERSION)})
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, p)  # atomic: a reader never sees half a file
    return len(rows)


def read_parquet(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    import pyarrow.parquet as pq

    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    try:
        table = pq.read_table(p)
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise DataError(f"{p}: not a readable Parquet file ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    meta = table.schema.metadata or {}
    version = meta.get(b"dreamgym_schema_version")
    if version is None:
        raise DataError(f"{p}: not a dreamgym trajectory file (no dreamgym_schema_version in its metadata)")
    _check_version(int(version), str(p))
    for i, row in enumerate(table.to_pylist()):
        where = f"{p}:row {i}"
        try:
            obj = {
                "schema_version": row["schema_version"],
                "traj_id": row["traj_id"],
                "task": json.loads(row["task_json"]),
                "success": row["success"],
                "source": row["source"],
                "policy": row["policy"],
                "meta": json.loads(row["meta_json"]),
                "transitions": [
                    {**{k: v for k, v in x.items() if k != "info_json"}, "info": json.loads(x["info_json"])}
                    for x in row["transitions"]
                ],
            }
            yield Trajectory.model_validate(obj)
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise DataError(f"{where}: malformed row ({type(e).__name__}: {e})") from None
        except ValidationError as e:
            raise DataError(f"{where}: {first_error(e)}") from None


def read_trajectories(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    """Read a ``.jsonl`` or ``.parquet`` trajectory file by its suffix."""
    p = Path(path)
    if p.suffix == ".parquet":
        return read_parquet(p)
    return read_jsonl(p)


def write_trajectories(path: str | os.PathLike[str], trajs: Iterable[Trajectory]) -> int:
    p = Path(path)
    if p.suffix == ".parquet":
        return write_parquet(p, trajs)
    return write_jsonl(p, trajs)


# ------------------------------------------------------------------ plain records other packages share


@dataclass
class Explanation:
    """What an env's rule-based explainer returns for one trajectory: one trace per transition, a task
    tutorial, and counted problems (e.g. ``reward_mismatch``) that the annotator adds to its stats."""

    reasoning: list[str]
    task_tutorial: dict[str, str] | None = None
    issues: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class ExperiencePrediction:
    """M_exp's answer for one step. ``failure`` names the parse failure when this is the fallback; ``recalled``: the
    answer is a recorded real transition's (:class:`~dreamgym.experience.recall.Recall`), not generated."""

    reasoning: str | None
    next_state: str
    reward: float
    done: bool
    success: bool
    failure: str | None = None
    recalled: bool = False
