"""Crash-safe, append-only storage of replay records and their embeddings in one directory.

Layout::

    meta.json        {"format": 1, "encoder": "...", "dim": d}    written once, atomically
    records.jsonl    one ReplayRecord per line                    append-only
    embeddings.f32   raw float32, row i = φ of record i           append-only
    commit.json      {"rows": n, "records_bytes": b}              replaced atomically after each batch
    lock             held (flock) by the one writer

Commit protocol of a batch: (1) append to both data files and (2) fsync them, then (3) write ``commit.json``
to a temp file and fsync it, (4) ``os.replace`` it over the old one, (5) fsync the directory. The replace is
the commit point; what a failure leaves at each point:

* before (4) (a kill, a Ctrl-C, a full disk): the old record stands. Bytes past the committed sizes belong to
  a torn batch: the failing writer cuts them itself, a writer that opens later truncates them (logged), a
  reader ignores them. The batch is lost, nothing else;
* after (4), in (5): the new record is in place over data already fsynced, so the batch is committed and
  stays (in the files and in the open store) and the exception propagates. (5) only makes the rename
  survive a power cut; without it a power cut brings back the old record, i.e. the case above;
* a record ahead of the data (what a Ctrl-C in (5) left before this was handled, or damage from outside):
  the store opens with the rows both data files hold whole, a writer rewrites the record, and the committed
  rows lost are logged and counted (``lost_rows``, in the buffer's stats).

So a ``kill -9`` at any moment loses at most the batch being written and never exposes half a record; readers
may open a buffer while a writer appends.

Besides the files, the store keeps in memory what retrieval filters need (env, source and trajectory of each
row as small integer codes), the byte offset of each record (records are read back with ``pread``) and the
exact-duplicate keys with the rows that hold them, and the rows of each action text.
"""

from __future__ import annotations

import fcntl
import logging
import os
from array import array
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from dreamgym.replay.files import fsync_dir, tmp_path, write_all, write_atomic
from dreamgym.replay.record import ReplayRecord
from dreamgym.types import DataError

log = logging.getLogger(__name__)
FORMAT = 1
META, RECORDS, EMBEDDINGS, COMMIT, LOCK = "meta.json", "records.jsonl", "embeddings.f32", "commit.json", "lock"


class StoreMeta(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = FORMAT
    encoder: str
    dim: int


class Commit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: int = 0
    records_bytes: int = 0


class Vocab:
    """Interns strings (env names, sources, trajectory ids) as dense integer codes."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.codes: dict[str, int] = {}

    def intern(self, name: str) -> int:
        code = self.codes.get(name)
        if code is None:
            code = self.codes[name] = len(self.names)
            self.names.append(name)
        return code


class Column:
    """A growable int32 column: amortised O(1) appends, ``values`` is a numpy view of the filled part.

    (Not ``array.array``: a numpy view of one blocks its resizing while the view lives.)
    """

    def __init__(self) -> None:
        self._data = np.zeros(1024, dtype=np.int32)
        self.size = 0

    def append(self, value: int) -> None:
        if self.size == len(self._data):
            self._data = np.concatenate([self._data, np.zeros_like(self._data)])
        self._data[self.size] = value
        self.size += 1

    @property
    def values(self) -> np.ndarray:
        return self._data[: self.size]


def _read_model(path: Path, model: type[BaseModel]) -> BaseModel:
    try:
        return model.model_validate_json(path.read_bytes())
    except ValidationError as e:
        raise DataError(f"{path}: malformed ({e.errors()[0]['msg']})") from None


class TransitionStore:
    """The files of one replay buffer. Single writer (enforced by a lock), any number of readers."""

    def __init__(self, path: Path, meta: StoreMeta, read_only: bool, lock_fd: int | None) -> None:
        self.path = path
        self.meta = meta
        self.read_only = read_only
        self._lock_fd = lock_fd
        self.rows = 0
        self.records_bytes = 0
        self._offsets = array("q", [0])  # byte offset of each record, plus the end
        self.env_codes, self.source_codes, self.traj_codes = Column(), Column(), Column()
        self.envs, self.sources, self.trajs = Vocab(), Vocab(), Vocab()
        self.traj_rows: dict[int, list[int]] = {}
        self.action_rows: dict[str, list[int]] = {}  # action text -> the rows that took it (same-action retrieval)
        self.task_action_rows: dict[tuple[str, str], list[int]] = {}  # (task instruction, action) -> its rows
        self.counts: Counter[tuple[int, int]] = Counter()  # rows per (env code, source code)
        self.iterations: Counter[int] = Counter()
        self._key_rows: dict[bytes, int] = {}  # exact-duplicate key -> the first row holding it
        self._more_key_rows: dict[bytes, list[int]] = {}  # later rows with the same key (re-added hidden rows)
        self._emb_view: np.ndarray | None = None
        self._read_fd = -1
        self._rec_fd = self._emb_fd = -1
        self.torn_bytes = 0  # bytes of an uncommitted batch dropped on open (writers)
        self.lost_rows = 0  # committed rows the data files no longer held on open (see the module docstring)

    # ------------------------------------------------------------------------------------------ opening

    @staticmethod
    def read_meta(root: Path) -> StoreMeta | None:
        """The metadata of the buffer at ``root``, None if there is none."""
        path = root / META
        if not path.exists():
            return None
        meta = _read_model(path, StoreMeta)
        assert isinstance(meta, StoreMeta)
        if meta.format != FORMAT:
            raise DataError(f"{path}: unsupported buffer format {meta.format} (this dreamgym reads {FORMAT})")
        return meta

    @classmethod
    def open(cls, path: str | os.PathLike[str], meta: StoreMeta | None, read_only: bool) -> TransitionStore:
        """Open the store at ``path``; create it with ``meta`` if it does not exist and ``meta`` is given."""
        root = Path(path)
        meta_path = root / META
        if not meta_path.exists():
            if meta is None or read_only:
                raise FileNotFoundError(f"{root}: no replay buffer here (no {META})")
            if root.exists() and any(root.iterdir()):
                raise DataError(f"{root}: directory is not empty and holds no replay buffer ({META} missing)")
            root.mkdir(parents=True, exist_ok=True)
            write_atomic(meta_path, meta.model_dump_json().encode())
        stored = cls.read_meta(root)
        assert stored is not None
        lock_fd = None if read_only else cls._lock(root)
        store = cls(root, stored, read_only, lock_fd)
        try:
            store._load()
        except BaseException:
            store.close()
            raise
        return store

    @staticmethod
    def _lock(root: Path) -> int:
        fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ValueError(f"{root}: the replay buffer is open for writing by another process") from None
        return fd

    def _load(self) -> None:
        commit_path = self.path / COMMIT
        commit = _read_model(commit_path, Commit) if commit_path.exists() else Commit()
        assert isinstance(commit, Commit)
        rec_path, emb_path = self.path / RECORDS, self.path / EMBEDDINGS
        row_bytes = self.meta.dim * 4
        rec_have, emb_have = (p.stat().st_size if p.exists() else 0 for p in (rec_path, emb_path))
        if rec_have < commit.records_bytes or emb_have < commit.rows * row_bytes:
            commit = self._recover(rec_path, commit, rec_have, emb_have // row_bytes)
        torn = 0
        for p, have, need in ((rec_path, rec_have, commit.records_bytes), (emb_path, emb_have, commit.rows * row_bytes)):
            if have > need and not self.read_only:
                # A batch that was being written when the last writer died (or one it could not cut): drop it.
                os.truncate(p, need)
                torn += have - need
        if torn and not self.lost_rows:
            self.torn_bytes = torn
            log.info("%s: dropped %d bytes of an uncommitted batch", self.path, torn)
        if not self.read_only:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            self._rec_fd, self._emb_fd = os.open(rec_path, flags, 0o644), os.open(emb_path, flags, 0o644)
            if self.lost_rows:
                write_atomic(commit_path, commit.model_dump_json().encode())
            fsync_dir(self.path)
        self._read_fd = os.open(rec_path, os.O_RDONLY)
        self._scan(rec_path, commit)

    def _recover(self, rec_path: Path, commit: Commit, rec_have: int, emb_rows: int) -> Commit:
        """A commit record ahead of the data: the largest prefix of rows held whole by both files (and committed)."""
        rows, records_bytes = 0, 0
        limit = min(commit.rows, emb_rows)
        if rows < limit and rec_have:
            with rec_path.open("rb") as f:
                for line in f:
                    if rows == limit or records_bytes + len(line) > commit.records_bytes or not line.endswith(b"\n"):
                        break
                    rows, records_bytes = rows + 1, records_bytes + len(line)
        self.lost_rows = commit.rows - rows
        log.warning("%s: the commit record (%d rows) is ahead of the data; opening the %d rows held whole (%d "
                    "committed rows lost)", self.path, commit.rows, rows, self.lost_rows)
        return Commit(rows=rows, records_bytes=records_bytes)

    def _scan(self, rec_path: Path, commit: Commit) -> None:
        """Read the committed records once: validates every line and rebuilds the in-memory columns."""
        with rec_path.open("rb") as f:
            pos = 0
            while pos < commit.records_bytes:
                line = f.readline(commit.records_bytes - pos)
                where = f"{rec_path}:{self.rows + 1}"
                if not line.endswith(b"\n"):
                    raise DataError(f"{where}: committed record is cut short")
                try:
                    record = ReplayRecord.model_validate_json(line)
                except ValidationError as e:
                    raise DataError(f"{where}: malformed record ({e.errors()[0]['msg']})") from None
                pos += len(line)
                self._index_row(record, record.key(), pos)
        if self.rows != commit.rows:
            raise DataError(f"{rec_path}: {self.rows} records but {commit.rows} are committed")
        self.records_bytes = pos

    def _index_row(self, record: ReplayRecord, key: bytes, end: int) -> None:
        env, source, traj = (
            self.envs.intern(record.env),
            self.sources.intern(record.source),
            self.trajs.intern(record.traj_id),
        )
        self.env_codes.append(env)
        self.source_codes.append(source)
        self.traj_codes.append(traj)
        self.traj_rows.setdefault(traj, []).append(self.rows)
        self.action_rows.setdefault(record.action, []).append(self.rows)
        self.task_action_rows.setdefault((record.instruction, record.action), []).append(self.rows)
        self.counts[env, source] += 1
        self.iterations[record.iteration] += 1
        if key in self._key_rows:
            self._more_key_rows.setdefault(key, []).append(self.rows)
        else:
            self._key_rows[key] = self.rows
        self._offsets.append(end)
        self.rows += 1

    # ---------------------------------------------------------------------------------------- appending

    def __len__(self) -> int:
        return self.rows

    def __contains__(self, key: bytes) -> bool:
        return key in self._key_rows

    def rows_of_key(self, key: bytes) -> list[int]:
        """The rows holding the transition with this exact-duplicate key (none, or one unless re-added after
        :meth:`~dreamgym.replay.ReplayBuffer.hide_rows`)."""
        first = self._key_rows.get(key)
        return [] if first is None else [first, *self._more_key_rows.get(key, ())]

    def append(self, records: Sequence[ReplayRecord], keys: Sequence[bytes], embeddings: np.ndarray) -> None:
        """Commit one batch (already deduplicated, embeddings float32 ``len(records) x dim``) atomically."""
        if self.read_only:
            raise ValueError(f"{self.path}: replay buffer opened read-only")
        if not records:
            return
        lines = [r.model_dump_json().encode() + b"\n" for r in records]
        data = b"".join(lines)
        commit = Commit(rows=self.rows + len(records), records_bytes=self.records_bytes + len(data))
        try:
            write_all(self._rec_fd, data)
            write_all(self._emb_fd, np.ascontiguousarray(embeddings, dtype=np.float32).tobytes())
            os.fsync(self._rec_fd)
            os.fsync(self._emb_fd)
            self._replace_commit(commit)
        except BaseException:
            if self._committed_on_disk() == commit:  # failed after the replace: the batch is committed
                self._index_batch(records, keys, lines)
                raise
            # Nothing of this batch is committed: cut what reached the data files so the next batch
            # starts at the committed end (a failure here leaves it to the next open).
            os.ftruncate(self._rec_fd, self.records_bytes)
            os.ftruncate(self._emb_fd, self.rows * self.meta.dim * 4)
            raise
        self._index_batch(records, keys, lines)
        fsync_dir(self.path)  # the rename survives a power cut (a failure here leaves the batch committed)

    def _replace_commit(self, commit: Commit) -> None:
        """Steps (3) and (4) of the commit protocol: the new record in a temp file, fsynced, renamed over."""
        path = self.path / COMMIT
        tmp = tmp_path(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, commit.model_dump_json().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def _committed_on_disk(self) -> Commit | None:
        try:
            commit = Commit.model_validate_json((self.path / COMMIT).read_bytes())
        except (OSError, ValueError):
            return None
        return commit

    def _index_batch(self, records: Sequence[ReplayRecord], keys: Sequence[bytes], lines: Sequence[bytes]) -> None:
        end = self.records_bytes
        for record, key, line in zip(records, keys, lines, strict=True):
            end += len(line)
            self._index_row(record, key, end)
        self.records_bytes = end

    # ------------------------------------------------------------------------------------------ reading

    def record(self, row: int) -> ReplayRecord:
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} out of range (store has {self.rows})")
        start, end = self._offsets[row], self._offsets[row + 1]
        return ReplayRecord.model_validate_json(os.pread(self._read_fd, end - start, start))

    def embeddings(self) -> np.ndarray:
        """All committed embeddings, ``rows x dim`` float32, memory-mapped read-only."""
        if self.rows == 0:
            return np.zeros((0, self.meta.dim), dtype=np.float32)
        if self._emb_view is None or len(self._emb_view) != self.rows:
            self._emb_view = np.memmap(
                self.path / EMBEDDINGS, dtype=np.float32, mode="r", shape=(self.rows, self.meta.dim)
            )
        return self._emb_view

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.iterdir() if p.is_file())

    @property
    def is_open(self) -> bool:
        return self._read_fd >= 0

    def close(self) -> None:
        self._emb_view = None
        for fd in (self._rec_fd, self._emb_fd, self._read_fd):
            if fd >= 0:
                os.close(fd)
        self._rec_fd = self._emb_fd = self._read_fd = -1
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

