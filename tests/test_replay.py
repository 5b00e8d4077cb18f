"""The experience replay buffer: retrieval against brute force, filters, duplicates, persistence, crashes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np
import pytest

from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.envs.shop.policies import make_policy
from dreamgym.replay import HashingEncoder, IndexConfig, ReplayBuffer, ReplayRecord, phi_text, transition_key
from dreamgym.types import Source, Trajectory, write_jsonl

# Approximate indexes from 100 rows, snapshotted on close.
IVF = IndexConfig(exact_max_rows=100, snapshot_min_rows=10_000_000)
HNSW = IndexConfig(exact_max_rows=100, approximate="hnsw", snapshot_min_rows=10_000_000)


@pytest.fixture(scope="module")
def shop_trajs() -> list[Trajectory]:
    env = make("shop", num_products=100)
    return list(iter_episodes(env, make_policy("noisy", seed=0), 24))


def records(n: int, env: str = "shop", source: Source = "real", prefix: str = "r", per_traj: int = 10) -> list[ReplayRecord]:
    return [
        ReplayRecord(
            traj_id=f"{prefix}-traj{i // per_traj}", task_id=f"task{i // per_traj}", instruction="buy a thing",
            env=env, source=source, step=i % per_traj, state=f"{prefix} state {i}", action=f"click[{prefix}{i}]",
            next_state=f"{prefix} next {i}", reward=float(i % 2), done=i % per_traj == per_traj - 1,
        )
        for i in range(n)
    ]


def clustered(n: int, dim: int, seed: int, centre: np.ndarray | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, dim)) if centre is None else centre[None, :]
    x = centres[rng.integers(0, len(centres), n)] + 0.5 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def brute_force(vectors: np.ndarray, query: np.ndarray, k: int, rows: np.ndarray | None = None) -> list[int]:
    rows = np.arange(len(vectors)) if rows is None else rows
    scores = vectors[rows] @ query
    return [int(r) for r in rows[np.argsort(-scores, kind="stable")[:k]]]


def test_retrieval_matches_brute_force_exact_ivf_and_hnsw(tmp_path: Path) -> None:
    dim, n = 32, 3000
    vectors, queries = clustered(n, dim, seed=0), clustered(50, dim, seed=1)
    for name, config in (("exact", IndexConfig()), ("ivf", IVF), ("hnsw", HNSW)):
        with ReplayBuffer.open(tmp_path / name, HashingEncoder(dim), config=config) as buf:
            assert buf.add_embedded(records(n), vectors) == n
            assert buf.index.kind == name
            hits = buf.search_rows(queries, k=8)
        recall = []
        for q, got in zip(queries, hits, strict=True):
            truth = brute_force(vectors, q, 8)
            rows = [r for r, _ in got]
            np.testing.assert_allclose([s for _, s in got], vectors[rows] @ q, atol=1e-5)  # scores are cosines
            assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
            if name == "exact":
                assert rows == truth
            recall.append(len(set(rows) & set(truth)) / 8)
        assert np.mean(recall) >= 0.95, (name, np.mean(recall))


def test_retrieve_by_text_returns_the_planted_transition_first(tmp_path: Path, shop_trajs: list[Trajectory]) -> None:
    enc = HashingEncoder(256)
    with ReplayBuffer.open(tmp_path / "b", enc) as buf:
        added = buf.add_trajectories(shop_trajs)
        stored = [buf.record(i) for i in range(len(buf))]
        vectors = enc.encode([phi_text(r.state, r.action) for r in stored])
        for row in range(0, added, 7):
            r = stored[row]
            hits = buf.retrieve(r.state, r.action, k=5)
            # The same (state, action) can occur in several episodes (e.g. the same search): any of them is exact.
            same = {i for i, s in enumerate(stored) if (s.state, s.action) == (r.state, r.action)}
            assert hits[0].row in same and hits[0].score == pytest.approx(1.0, abs=1e-5)
            top = stored[hits[0].row]
            assert (hits[0].state, hits[0].action, hits[0].next_state) == (top.state, top.action, top.next_state)
            assert hits[0].instruction == top.instruction and hits[0].traj_id == top.traj_id
            truth = vectors @ vectors[row]  # ties are common in hashed features: compare scores, not order
            np.testing.assert_allclose([h.score for h in hits], np.sort(truth)[::-1][:5], atol=1e-5)
            np.testing.assert_allclose([h.score for h in hits], truth[[h.row for h in hits]], atol=1e-5)
        batch = buf.retrieve_batch([(r.state, r.action) for r in stored[:4]], k=3)
        assert [b[0].row for b in batch] == [0, 1, 2, 3]


class CountingEncoder(HashingEncoder):
    """The hashing encoder, counting the texts it is asked to embed."""

    def __init__(self) -> None:
        super().__init__(64)
        self.encoded = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.encoded += len(texts)
        return super().encode(texts)


def test_transitions_retrieved_for_are_not_encoded_again_when_added(
    tmp_path: Path, shop_trajs: list[Trajectory]
) -> None:
    enc = CountingEncoder()
    with ReplayBuffer.open(tmp_path / "b", enc) as buf:
        buf.add_trajectories(shop_trajs[:4])
        queries = [(x.state, x.action) for t in shop_trajs[4:] for x in t.transitions]  # the dream episodes
        buf.retrieve_batch(queries, k=2)
        encoded = enc.encoded
        added = buf.add_trajectories(shop_trajs[4:], iteration=0)  # ... added once they end
        assert added > 0 and enc.encoded == encoded
        new = [buf.record(i) for i in range(len(buf) - added, len(buf))]
        fresh = HashingEncoder(64).encode([phi_text(r.state, r.action) for r in new])
        np.testing.assert_array_equal(buf.store.embeddings()[-added:], fresh)


def test_filters_env_source_and_exclude_traj(tmp_path: Path) -> None:
    dim = 16
    recs = records(300, "shop", "real", "a") + records(200, "web", "real", "b") + records(100, "shop", "synthetic", "c")
    vectors = clustered(len(recs), dim, seed=2)
    with ReplayBuffer.open(tmp_path / "b", HashingEncoder(dim)) as buf:
        buf.add_embedded(recs, vectors)
        query = vectors[5]  # a row of trajectory "a-traj0"
        cases = [
            ({}, lambda r: True),
            ({"env": "web"}, lambda r: r.env == "web"),
            ({"source": "synthetic"}, lambda r: r.source == "synthetic"),
            ({"env": "shop", "source": "real"}, lambda r: r.env == "shop" and r.source == "real"),
            ({"exclude_traj": "a-traj0"}, lambda r: r.traj_id != "a-traj0"),
            ({"env": "shop", "exclude_traj": "a-traj0"}, lambda r: r.env == "shop" and r.traj_id != "a-traj0"),
        ]
        for kwargs, keep in cases:
            exclude = kwargs.pop("exclude_traj", None)
            got = buf.search(query, k=8, exclude_traj=[exclude], **kwargs)[0]
            allowed = np.array([i for i, r in enumerate(recs) if keep(r) and r.traj_id != exclude])
            assert [h.row for h in got] == brute_force(vectors, query, 8, allowed), kwargs
            assert all(keep(h) for h in got)
        assert buf.search(query, k=8, env="nowhere")[0] == []
        assert buf.search(query, k=8, source="synthetic", env="web")[0] == []
        assert len(buf.search(query, k=1000)[0]) == len(recs)  # k larger than the buffer


@pytest.mark.parametrize("config", [IVF, HNSW], ids=["ivf", "hnsw"])
def test_filtered_approximate_search_falls_back_to_exact(tmp_path: Path, config: IndexConfig) -> None:
    """The rows passing the filter sit far from the query: more candidates than the index may over-fetch
    (4096) fail the filter, so the query is answered by exact search."""
    dim = 16
    axis = np.eye(dim, dtype=np.float32)[0]
    near, far = clustered(4500, dim, 3, centre=4 * axis), clustered(700, dim, 4, centre=-4 * axis)
    vectors = np.concatenate([near, far])
    with ReplayBuffer.open(tmp_path / "b", HashingEncoder(dim), config=config) as buf:
        buf.add_embedded(records(4500, "shop", prefix="n") + records(700, "web", prefix="f"), vectors)
        assert buf.index.kind == config.approximate
        got = buf.search_rows(axis, k=8, env="web")[0]
        assert [r for r, _ in got] == brute_force(vectors, axis, 8, np.arange(4500, 5200))
        assert buf.stats().exact_fallbacks == 1
        query = vectors[35]  # over-fetching suffices; its own trajectory (rows 30..39) is excluded
        got = buf.search_rows(query, k=8, env="shop", exclude_traj=["n-traj3"])[0]
        truth = brute_force(vectors, query, 8, np.setdiff1d(np.arange(4500), np.arange(30, 40)))
        assert len(got) == 8 and all(r < 4500 and not 30 <= r < 40 for r, _ in got)
        assert len({r for r, _ in got} & set(truth)) >= 6  # the index is approximate
        assert buf.stats().exact_fallbacks == 1


def test_duplicates_are_suppressed_within_a_batch_and_across_reopen(
    tmp_path: Path, shop_trajs: list[Trajectory]
) -> None:
    path, enc = tmp_path / "b", HashingEncoder(64)
    keys = {r.key() for t in shop_trajs for r in ReplayRecord.from_trajectory(t)}
    with ReplayBuffer.open(path, enc) as buf:
        assert buf.add_trajectories(shop_trajs + shop_trajs[:3]) == len(keys)
        assert buf.add_trajectories(shop_trajs) == 0
    with ReplayBuffer.open(path, enc) as buf:
        assert buf.add_trajectories(shop_trajs) == 0
        changed = shop_trajs[0].model_copy(deep=True)
        changed.transitions[0].reward = 0.5  # same (s, a, s') with another reward is not a duplicate
        assert buf.add_trajectories([changed]) == 1
        assert len(buf) == len(keys) + 1


def test_reopen_preserves_records_stats_and_retrieval(tmp_path: Path, shop_trajs: list[Trajectory]) -> None:
    path, enc = tmp_path / "b", HashingEncoder(64)
    with ReplayBuffer.open(path, enc, config=HNSW) as buf:
        buf.add_trajectories(shop_trajs[:12])
        synthetic = [t.model_copy(update={"source": "synthetic", "traj_id": t.traj_id + "-s"}) for t in shop_trajs[12:]]
        buf.add_trajectories(synthetic, iteration=3)
        before = [buf.record(i) for i in range(len(buf))]
        stats = buf.stats()
        queries = [(r.state, r.action) for r in before[::5]]
        hits = buf.retrieve_batch(queries, k=4)
    assert stats.by_source.keys() == {"real", "synthetic"} and set(stats.by_iteration) == {-1, 3}
    with ReplayBuffer.open(path, config=HNSW) as buf:  # encoder taken from the buffer's metadata
        assert buf.encoder.name == enc.name and buf.index.kind == "hnsw"
        assert [buf.record(i) for i in range(len(buf))] == before
        reopened = buf.stats()
        assert reopened.model_dump(exclude={"disk_bytes"}) == stats.model_dump(exclude={"disk_bytes", "snapshot_rows"}) | {
            "snapshot_rows": len(before)
        }
        assert buf.retrieve_batch(queries, k=4) == hits
        buf.check(sample=len(buf))


def test_open_errors_lock_and_read_only_view(tmp_path: Path) -> None:
    path = tmp_path / "b"
    with pytest.raises(FileNotFoundError):
        ReplayBuffer.open(path, HashingEncoder(32), create=False)
    writer = ReplayBuffer.open(path, HashingEncoder(32))
    try:
        writer.add_embedded(records(10), clustered(10, 32, 0))
        with pytest.raises(ValueError, match="open for writing"):
            ReplayBuffer.open(path, HashingEncoder(32))
        with ReplayBuffer.open(path, read_only=True) as reader:  # sees the committed batch while the writer runs
            assert len(reader) == 10
            with pytest.raises(ValueError, match="read-only"):
                reader.add_embedded(records(1, prefix="z"), clustered(1, 32, 1))
        with pytest.raises(ValueError, match="shape"):
            writer.add_embedded(records(2, prefix="y"), clustered(3, 32, 1))
    finally:
        writer.close()
    with pytest.raises(ValueError, match="hashing-32"):
        ReplayBuffer.open(path, HashingEncoder(64))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        ReplayBuffer.open(tmp_path / "other", HashingEncoder(32))


def test_torn_tail_is_dropped_on_open(tmp_path: Path) -> None:
    path, enc = tmp_path / "b", HashingEncoder(32)
    with ReplayBuffer.open(path, enc) as buf:
        buf.add_embedded(records(20), clustered(20, 32, 0))
    with (path / "records.jsonl").open("ab") as f:
        f.write(b'{"traj_id": "half a rec')
    with (path / "embeddings.f32").open("ab") as f:
        f.write(b"\x00" * 100)
    with ReplayBuffer.open(path, enc) as buf:
        assert len(buf) == 20
        buf.add_embedded(records(5, prefix="new"), clustered(5, 32, 1))
    with ReplayBuffer.open(path, enc) as buf:
        assert len(buf) == 25 and buf.record(24).state == "new state 4"
        buf.check(sample=25)


def test_interrupt_after_the_commit_replace_keeps_every_committed_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C after ``os.replace`` of commit.json but before the directory fsync: the batch is committed (the
    record says so), so the data stays, the open buffer goes on consistently and the store reopens whole."""
    from dreamgym.replay import files, store

    path, enc = tmp_path / "b", HashingEncoder(32)
    with ReplayBuffer.open(path, enc) as buf:
        buf.add_embedded(records(20), clustered(20, 32, 0))

        def interrupted(directory: Path) -> None:
            raise KeyboardInterrupt

        with monkeypatch.context() as m:
            m.setattr(files, "fsync_dir", interrupted)
            m.setattr(store, "fsync_dir", interrupted, raising=False)
            with pytest.raises(KeyboardInterrupt):
                buf.add_embedded(records(5, prefix="new"), clustered(5, 32, 1))
        assert len(buf) == 25  # the commit record was replaced: the batch is in
        buf.check(sample=25)
        buf.add_embedded(records(5, prefix="after"), clustered(5, 32, 2))
    with ReplayBuffer.open(path, enc) as buf:
        assert len(buf) == 30
        assert [buf.record(i).state for i in (0, 19, 24, 29)] == ["r state 0", "r state 19", "new state 4", "after state 4"]
        assert buf.stats().lost_rows == 0
        buf.check(sample=30)


@pytest.mark.parametrize("point", ["fsync 1", "fsync 2", "fsync 3", "replace"])
def test_interrupt_before_the_commit_replace_leaves_the_previous_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """A failure anywhere before the commit record is replaced (the fsync of the records, of the embeddings, of
    the record's temp file, or the rename itself) cuts the batch; the buffer goes on from the previous commit."""
    path, enc = tmp_path / "b", HashingEncoder(32)
    with ReplayBuffer.open(path, enc) as buf:
        buf.add_embedded(records(20), clustered(20, 32, 0))
        real_fsync, real_replace = os.fsync, os.replace
        calls = {"n": 0}

        def failing_fsync(fd: int) -> None:
            calls["n"] += 1
            if point == f"fsync {calls['n']}":
                raise KeyboardInterrupt
            real_fsync(fd)

        def failing_replace(src: str, dst: str) -> None:
            if Path(dst).name == "commit.json":
                raise KeyboardInterrupt
            real_replace(src, dst)

        with monkeypatch.context() as m:
            m.setattr(os, "fsync", failing_fsync)
            if point == "replace":
                m.setattr(os, "replace", failing_replace)
            with pytest.raises(KeyboardInterrupt):
                buf.add_embedded(records(5, prefix="new"), clustered(5, 32, 1))
        assert len(buf) == 20
        assert (path / "records.jsonl").stat().st_size == buf.store.records_bytes  # the batch was cut
        buf.add_embedded(records(5, prefix="after"), clustered(5, 32, 2))
    with ReplayBuffer.open(path, enc) as buf:
        assert len(buf) == 25 and buf.record(24).state == "after state 4"
        buf.check(sample=25)


def test_a_commit_record_ahead_of_the_data_is_repaired_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What an interrupted commit left before this was fixed (data cut back under a replaced record), or damage:
    the store opens with the rows both files hold whole, logs and counts the committed rows it lost."""
    path, enc = tmp_path / "b", HashingEncoder(32)
    with ReplayBuffer.open(path, enc) as buf:
        buf.add_embedded(records(20), clustered(20, 32, 0))
    commit = json.loads((path / "commit.json").read_text())
    (path / "commit.json").write_text(json.dumps({"rows": commit["rows"] + 5, "records_bytes": commit["records_bytes"] + 999}))
    with ReplayBuffer.open(path, enc, read_only=True) as reader, caplog.at_level(logging.WARNING):
        assert len(reader) == 20 and reader.stats().lost_rows == 5
    caplog.clear()
    with caplog.at_level(logging.WARNING), ReplayBuffer.open(path, enc) as buf:
        assert len(buf) == 20 and buf.stats().lost_rows == 5
        buf.check(sample=20)
        buf.add_embedded(records(5, prefix="new"), clustered(5, 32, 1))
    assert any("ahead of the data" in r.getMessage() for r in caplog.records)
    with (path / "embeddings.f32").open("r+b") as f:  # embeddings short by two rows: the records are cut too
        f.truncate(23 * 32 * 4)
    with ReplayBuffer.open(path, enc) as buf:
        assert len(buf) == 23 and buf.stats().lost_rows == 2 and buf.record(22).state == "new state 2"
        buf.check(sample=23)
    with ReplayBuffer.open(path, enc) as buf:  # repaired on disk: nothing more to repair
        assert len(buf) == 23 and buf.stats().lost_rows == 0


@pytest.mark.parametrize("config", [IVF, HNSW], ids=["ivf", "hnsw"])
def test_stale_missing_or_corrupt_snapshot_is_repaired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, config: IndexConfig
) -> None:
    path, enc, dim = tmp_path / "b", HashingEncoder(32), 32
    vectors = clustered(700, dim, seed=5)
    with ReplayBuffer.open(path, enc, config=config) as buf:
        buf.add_embedded(records(400), vectors[:400])
    stale = tmp_path / "stale.faiss"
    shutil.copy(path / "index.faiss", stale)
    with ReplayBuffer.open(path, enc, config=config) as buf:
        buf.add_embedded(records(300, prefix="late"), vectors[400:])
    for damage in ("stale", "missing", "corrupt"):
        if damage == "stale":
            shutil.copy(stale, path / "index.faiss")
        elif damage == "missing":
            (path / "index.faiss").unlink()
        else:
            (path / "index.faiss").write_bytes(b"not a faiss index")
        caplog.clear()
        with caplog.at_level(logging.WARNING), ReplayBuffer.open(path, enc, config=config) as buf:
            assert buf.index.kind == config.approximate and buf.index.ntotal == 700
            buf.check(sample=700)
            assert buf.search_rows(vectors[650], k=1)[0][0][0] == 650  # a row the stale snapshot lacked
        assert (damage == "stale") == (not caplog.records), damage  # a rebuild is logged


def test_ivf_retrains_as_the_buffer_grows_and_switches_kind_on_reopen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """nlist follows the size (doubling on each 4x growth, re-adding every row under its row id); a snapshot of
    another kind than the config asks for is rebuilt."""
    path, enc, dim = tmp_path / "b", HashingEncoder(32), 32
    vectors = clustered(2000, dim, seed=6)
    with ReplayBuffer.open(path, enc, config=IVF) as buf:
        nlists = []
        for start in range(0, 2000, 200):
            buf.add_embedded(records(200, prefix=f"p{start}"), vectors[start : start + 200])
            assert isinstance(buf.index.index, faiss.IndexIVFFlat)
            nlists.append(buf.index.index.nlist)
        assert nlists == [5, 10, 10, 20, 20, 20, 20, 40, 40, 40]  # min(4·sqrt(rows), rows // 40) at training
        assert buf.index.retrains == 4
        buf.check(sample=2000)
        hits = buf.search_rows(vectors, k=8)
        assert [h[0][0] for h in hits] == list(range(2000))  # every row finds itself first
        recall = [len({r for r, _ in h} & set(brute_force(vectors, v, 8))) / 8 for h, v in zip(hits, vectors, strict=True)]
        assert np.mean(recall) >= 0.95
    with caplog.at_level(logging.WARNING), ReplayBuffer.open(path, enc, config=HNSW) as buf:
        assert buf.index.kind == "hnsw" and buf.index.ntotal == 2000
        buf.check(sample=2000)
    assert any("the config asks for hnsw" in r.getMessage() for r in caplog.records)


CHILD = """
import sys
from dreamgym.replay import HashingEncoder, IndexConfig, ReplayBuffer, ReplayRecord

path, batch = sys.argv[1], int(sys.argv[2])
config = IndexConfig(exact_max_rows=300, snapshot_min_rows=200)  # IVF, retrains, frequent snapshots: kills land anywhere
buf = ReplayBuffer.open(path, HashingEncoder(32), config=config)
print(len(buf), flush=True)
while True:
    recs = [
        ReplayRecord(traj_id=f"b{batch}", task_id="t", instruction="i", env="shop", source="real", step=j,
                     state=f"state {batch} {j}", action=f"click[{batch}x{j}]", next_state=f"next {batch} {j}",
                     reward=0.0, done=False)
        for j in range(40)
    ]
    buf.add_transitions(recs)
    print(len(buf), flush=True)
    batch += 1
"""


def test_sigkill_mid_add_loses_at_most_the_open_batch(tmp_path: Path) -> None:
    path = tmp_path / "b"
    rng = np.random.default_rng(0)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    committed = 0
    for round_ in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(10_000 * round_)], stdout=subprocess.PIPE, text=True, env=env
        )
        assert child.stdout is not None
        reported = [int(child.stdout.readline())]
        assert reported[0] >= committed  # what the previous child reported survived its kill
        deadline = time.monotonic() + 60
        while reported[-1] < reported[0] + 400 + 80 * round_ and time.monotonic() < deadline:
            reported.append(int(child.stdout.readline()))
        time.sleep(rng.uniform(0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait()
        committed = reported[-1]
    with ReplayBuffer.open(path, HashingEncoder(32)) as buf:
        assert committed <= len(buf) <= committed + 40
        buf.check(sample=len(buf))
        rows = [buf.record(i) for i in range(len(buf))]  # every record parses
        assert len({(r.state, r.action) for r in rows}) == len(rows)
        assert all(r.state == f"state {r.traj_id[1:]} {r.step}" for r in rows)
        assert len(buf) % 40 == 0  # whole batches only
        assert buf.retrieve(rows[-1].state, rows[-1].action, k=1)[0].row == len(rows) - 1


@pytest.mark.slow  # loads the real model (~10 s)
def test_minilm_encoder_retrieves_by_meaning(tmp_path: Path) -> None:
    from dreamgym.replay import MiniLMEncoder

    enc = MiniLMEncoder()
    recs = [
        ReplayRecord(traj_id=f"t{i}", task_id=f"t{i}", instruction="shop", env="shop", source="real",
                     state=state, action=action, next_state="...", reward=0.0, done=False)
        for i, (state, action) in enumerate(
            [
                ("[1] text: Search for products", "search[red cotton t-shirt]"),
                ("[1] text: Search for products", "search[wireless gaming mouse]"),
                ("[1] link: B07ABC — Oak Dining Table | $240.00", "click[buy now]"),
                ("[1] text: Page 1 (results 1-5 of 50)", "click[next >]"),
            ]
        )
    ]
    with ReplayBuffer.open(tmp_path / "b", enc) as buf:
        assert buf.add_transitions(recs) == 4
        vectors = buf.store.embeddings()
        assert vectors.shape == (4, 384)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        hits = buf.retrieve("[1] text: Search for products", "search[crimson tee shirt in cotton]", k=4)
        assert hits[0].action == "search[red cotton t-shirt]"
        hits = buf.retrieve("[1] text: Search for products", "search[bluetooth mouse for gaming]", k=4)
        assert hits[0].action == "search[wireless gaming mouse]"


def test_cli_build_query_stats(tmp_path: Path, shop_trajs: list[Trajectory]) -> None:
    import json

    from typer.testing import CliRunner

    from dreamgym.cli import app

    runner = CliRunner()
    data, out = tmp_path / "d.jsonl", tmp_path / "buf"
    write_jsonl(data, shop_trajs)
    unique = len({r.key() for t in shop_trajs for r in ReplayRecord.from_trajectory(t)})
    total = sum(t.num_steps for t in shop_trajs)
    build = ["buffer", "build", "--data", str(data), "--out", str(out)]
    r = runner.invoke(app, [*build, "--data", str(data), "--encoder", "hashing"])
    assert r.exit_code == 0, r.output
    assert f"added {unique} transitions ({2 * total - unique} exact duplicates skipped)" in r.output
    t = shop_trajs[2].transitions[1]
    r = runner.invoke(app, ["buffer", "query", str(out), "--state", t.state, "--action", t.action, "-k", "3", "--json"])
    assert r.exit_code == 0, r.output
    hits = json.loads(r.stdout)
    assert len(hits) == 3 and hits[0]["action"] == t.action and hits[0]["score"] == pytest.approx(1.0, abs=1e-5)
    r = runner.invoke(app, ["buffer", "stats", str(out), "--check", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["transitions"] == unique
    r = runner.invoke(app, [*build, "--encoder", "hashing-32"])
    assert isinstance(r.exception, ValueError) and "hashing-384" in str(r.exception)
    # Through the real entry point: a malformed file is one line on stderr and exit code 2.
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    cmd = [sys.executable, "-m", "dreamgym", "buffer", "build", "--data", str(tmp_path / "bad.jsonl"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "bad.jsonl:1" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("config", [IndexConfig(), IVF], ids=["exact", "ivf"])
def test_hidden_rows_are_neither_retrieved_nor_duplicates(tmp_path: Path, config: IndexConfig) -> None:
    dim = 32
    vectors = clustered(400, dim, seed=3)
    with ReplayBuffer.open(tmp_path / "buf", HashingEncoder(dim), config=config) as buf:
        recs = records(400)
        buf.add_embedded(recs[:300], vectors[:300])
        buf.add_embedded(recs[300:], vectors[300:])  # e.g. what a killed run wrote after its checkpoint
        assert buf.hide_rows(300, 10_000) == 100
        for q in clustered(20, dim, seed=4):
            hits = [r for r, _ in buf.search_rows(q, 8)[0]]
            assert hits == brute_force(vectors, q, 8, rows=np.arange(300))
            assert [r for r, _ in buf.search_rows(q, 8, source="real")[0]] == hits  # filtered path too
        # The resumed run redoes that work: its identical transitions are added again, once.
        assert buf.add_embedded(recs[300:350] + recs[:10], np.concatenate([vectors[300:350], vectors[:10]])) == 50
        assert buf.add_embedded(recs[300:350], vectors[300:350]) == 0
        assert len(buf) == 450
        q = vectors[320]
        assert [r for r, _ in buf.search_rows(q, 1)[0]] == [400 + 20]  # the visible copy of row 320


@pytest.mark.parametrize("config", [IndexConfig(), IVF], ids=["exact", "ivf"])
def test_exclude_key_keeps_out_a_transition_stored_under_another_trajectory(tmp_path: Path, config: IndexConfig) -> None:
    recs = records(200)
    copy = recs[5].model_copy(update={"traj_id": "x-traj", "step": 0})  # the same transition in another episode
    with ReplayBuffer.open(tmp_path / "b", HashingEncoder(64), config=config) as buf:
        assert buf.add_transitions([*recs, copy]) == 200  # a duplicate: stored once, under r-traj0
        assert buf.store.rows_of_key(copy.key()) == [5] and buf.store.rows_of_key(b"nope") == []
        for env in (None, "shop"):  # the unfiltered and the filtered path
            own = buf.retrieve(copy.state, copy.action, k=1, env=env, exclude_traj="x-traj")
            assert [h.row for h in own] == [5]  # excluding the own trajectory does not keep it out ...
            hits = buf.retrieve(copy.state, copy.action, k=3, env=env, exclude_traj="x-traj", exclude_key=copy.key())
            assert len(hits) == 3 and all(h.key() != copy.key() for h in hits)  # ... its key does
        batch = buf.retrieve_batch([(copy.state, copy.action)] * 2, k=1, exclude_key=[copy.key(), None])
        assert [h.row for h in batch[1]] == [5] and batch[0][0].row != 5
        with pytest.raises(ValueError, match="exclude_key"):
            buf.search_rows(buf.store.embeddings()[:2], k=1, exclude_key=[None])
        # A hidden row added again has two stored copies (also after reopening): both are excluded.
        buf.hide_rows(5, 6)
        assert buf.add_transitions([copy]) == 1
    with ReplayBuffer.open(tmp_path / "b", HashingEncoder(64), config=config) as buf:
        assert buf.store.rows_of_key(copy.key()) == [5, 200]
        hits = buf.retrieve(copy.state, copy.action, k=3, exclude_key=copy.key())
        assert {h.row for h in hits}.isdisjoint({5, 200}) and len(hits) == 3


@pytest.mark.parametrize("config", [IndexConfig(), IVF], ids=["exact", "ivf"])
def test_keep_key_lets_a_query_see_the_copy_stored_under_its_own_trajectory(tmp_path: Path, config: IndexConfig) -> None:
    recs = records(200)
    copy = recs[5].model_copy(update={"traj_id": "x-traj", "step": 0})  # stored once, under r-traj0
    with ReplayBuffer.open(tmp_path / "b", HashingEncoder(64), config=config) as buf:
        buf.add_transitions([*recs, copy])
        for env in (None, "shop"):
            # r-traj0's query for its own row 5: excluded with its trajectory, kept when its key is to be kept ...
            gone = buf.retrieve(copy.state, copy.action, k=3, env=env, exclude_traj="r-traj0")
            assert 5 not in {h.row for h in gone} and len(gone) == 3
            kept = buf.retrieve(copy.state, copy.action, k=3, env=env, exclude_traj="r-traj0", keep_key=copy.key())
            assert kept[0].row == 5
            # ... and the trajectory's other rows stay out.
            assert {h.row for h in kept}.isdisjoint(set(range(10)) - {5})
        batch = buf.retrieve_batch([(copy.state, copy.action)] * 2, k=1, exclude_traj=["r-traj0"] * 2,
                                   keep_key=[copy.key(), None])
        assert batch[0][0].row == 5 and batch[1][0].row != 5
        with pytest.raises(ValueError, match="keep_key"):
            buf.search_rows(buf.store.embeddings()[:2], k=1, keep_key=[None])


def test_transition_key_is_the_key_a_step_is_stored_under(shop_trajs: list[Trajectory]) -> None:
    for traj in shop_trajs[:3]:
        for t, record in enumerate(ReplayRecord.from_trajectory(traj)):
            assert transition_key(traj, t) == record.key()
    other = shop_trajs[0].model_copy(update={"traj_id": "other"})
    assert transition_key(other, 0) == transition_key(shop_trajs[0], 0)  # the trajectory plays no part


@pytest.mark.parametrize("config", [IndexConfig(), IVF], ids=["exact", "ivf"])
def test_same_action_first_puts_the_rows_that_took_the_action_in_front(tmp_path: Path, config: IndexConfig) -> None:
    recs = records(200)
    query_state, query_action = recs[7].state, "click[b0target]"
    # Two rows took the query's action from pages unlike the query's; the most similar rows took other actions.
    far = [recs[150 + i].model_copy(update={"traj_id": f"far{i}", "state": f"another page {i} entirely",
                                            "action": query_action, "next_state": f"target page {i}"})
           for i in range(2)]
    other_env = recs[160].model_copy(update={"traj_id": "tw", "env": "textworld", "action": query_action,
                                             "state": "unrelated", "next_state": "textworld page"})
    with ReplayBuffer.open(tmp_path / "b", HashingEncoder(64), config=config) as buf:
        buf.add_transitions([*recs, *far, other_env])
        plain = buf.retrieve(query_state, query_action, k=3, env="shop")
        assert all(h.action != query_action for h in plain)  # φ's nearest rows: the query page's other clicks
        same = buf.retrieve(query_state, query_action, k=3, env="shop", same_action_first=True)
        assert [h.action for h in same[:2]] == [query_action] * 2 and {h.traj_id for h in same[:2]} == {"far0", "far1"}
        assert same[2].row == plain[0].row  # then the rest, by similarity
        # Filters and exclusions hold for the same-action rows too.
        kept_out = buf.retrieve(query_state, query_action, k=3, env="shop", exclude_traj="far0", same_action_first=True)
        assert [h.traj_id for h in kept_out[:1]] == ["far1"] and kept_out[1].action != query_action
        assert all(h.env == "shop" for h in buf.retrieve(query_state, query_action, k=5, env="shop",
                                                          same_action_first=True))
        assert buf.retrieve(query_state, query_action, k=1, same_action_first=True)[0].action == query_action
        # An action nobody took: the plain ranking.
        unseen = buf.retrieve(query_state, "click[nothing]", k=3, same_action_first=True)
        assert [h.row for h in unseen] == [h.row for h in buf.retrieve(query_state, "click[nothing]", k=3)]
        (row,) = buf.store.rows_of_key(far[0].key())
        buf.hide_rows(row, row + 1)
        assert all(h.traj_id != "far0" for h in buf.retrieve(query_state, query_action, k=3, same_action_first=True))
    with ReplayBuffer.open(tmp_path / "b", HashingEncoder(64), config=config) as buf:  # rebuilt on reopen
        again = buf.retrieve(query_state, query_action, k=2, env="shop", same_action_first=True)
        assert {h.traj_id for h in again} == {"far0", "far1"}
        with pytest.raises(ValueError, match="actions"):
            buf.search_rows(buf.store.embeddings()[:2], k=1, actions=["click[x]"])


@pytest.mark.parametrize("config", [IndexConfig(), IVF], ids=["exact", "ivf"])
def test_task_rows_of_the_action_come_before_the_other_same_action_rows(tmp_path: Path, config: IndexConfig) -> None:
    """``tasks``: the rows recorded in the query's task that took its action first (what a game hides until that
    action shows it is the same whenever the game takes it), then the other same-action rows, then the rest."""
    recs = records(200)
    query_state, action = recs[7].state, "open fridge"
    near = recs[8].model_copy(update={"traj_id": "near", "instruction": "cook task B", "action": action,
                                      "next_state": "B's fridge"})  # like the query's page, another task
    own = [recs[150 + i].model_copy(update={"traj_id": f"own{i}", "instruction": "cook task A", "action": action,
                                            "state": f"a page unlike the query's {i}", "next_state": "A's fridge"})
           for i in range(2)]
    with ReplayBuffer.open(tmp_path / "b", HashingEncoder(64), config=config) as buf:
        buf.add_transitions([*recs, near, *own])
        same = buf.retrieve(query_state, action, k=3, same_action_first=True)
        assert same[0].traj_id == "near"  # without the task: the most similar row that took the action
        tasked = buf.retrieve(query_state, action, k=4, same_action_first=True, task="cook task A")
        assert {h.traj_id for h in tasked[:2]} == {"own0", "own1"} and tasked[2].traj_id == "near"
        assert tasked[3].action != action  # then the rest, by similarity
        alone = buf.retrieve(query_state, action, k=3, task="cook task A")  # without same_action_first
        plain = [h.row for h in buf.retrieve(query_state, action, k=3) if not h.traj_id.startswith("own")]
        assert {h.traj_id for h in alone[:2]} == {"own0", "own1"} and alone[2].row == plain[0]
        assert buf.retrieve(query_state, action, k=2, task="cook task A", exclude_traj="own0")[0].traj_id == "own1"
        assert buf.retrieve(query_state, action, k=1, task="no such task")[0].row == \
            buf.retrieve(query_state, action, k=1)[0].row
        # A dreamt row of the task's action, however like the query's page, comes after its real ones: the prompt
        # shows what the game showed, not what a dream wrote.
        dreamt = recs[7].model_copy(update={"traj_id": "dream0", "instruction": "cook task A", "action": action,
                                            "next_state": "a dreamt fridge", "source": "synthetic"})
        buf.add_transitions([dreamt])
        tasked = buf.retrieve(query_state, action, k=3, task="cook task A")
        assert [h.traj_id for h in tasked][2] == "dream0" and {h.traj_id for h in tasked[:2]} == {"own0", "own1"}
        assert buf.retrieve(query_state, action, k=1, same_action_first=True)[0].traj_id == "dream0"  # φ's nearest
        assert buf.retrieve(query_state, action, k=1, task="cook task A", exclude_traj="own0",
                            source="synthetic")[0].traj_id == "dream0"  # a source filter still holds
    with ReplayBuffer.open(tmp_path / "b", HashingEncoder(64), config=config) as buf:  # rebuilt on reopen
        assert {h.traj_id for h in buf.retrieve(query_state, action, k=2, task="cook task A")} == {"own0", "own1"}
        with pytest.raises(ValueError, match="task_actions"):
            buf.search_rows(buf.store.embeddings()[:2], k=1, task_actions=[("cook task A", action)])
