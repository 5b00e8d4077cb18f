"""The faiss index over the stored embeddings: top-k by inner product of unit vectors, i.e. cosine.

Index ids are store rows (vectors are added in row order). The kind follows the size:

* up to ``exact_max_rows`` rows, exact search (``IndexFlatIP``): under a millisecond at 10k rows, no recall
  loss, and nothing to persist (it is rebuilt from ``embeddings.f32`` on open in well under a second);
* above, HNSW (``IndexHNSWFlat``, inner product): sub-millisecond at 1M rows, incremental adds, no training
  (so it follows the buffer as synthetic experience shifts its distribution). Building it costs minutes at
  1M rows on 2 cores, so it is snapshotted (``index.faiss``) and on open only the rows the snapshot lacks
  are added.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from dreamgym.replay.files import replace_durably, tmp_path

log = logging.getLogger(__name__)
SNAPSHOT = "index.faiss"
ADD_CHUNK = 65_536


@dataclass(frozen=True)
class IndexConfig:
    """How the index is built and searched (not stored in the buffer: pass it on every open)."""

    exact_max_rows: int = 20_000
    hnsw_m: int = 32
    ef_construction: int = 40
    ef_search: int = 128
    # Snapshot HNSW once this many rows (and at least a quarter of the snapshot) are not in it: bounds the
    # catch-up work on open while keeping snapshot writes (O(rows) each) amortised O(1) per add.
    snapshot_min_rows: int = 50_000
    # OpenMP threads faiss may use for the buffer's adds and searches. A top-8 query gains nothing from
    # threads, and on shared CPUs spinning OpenMP threads made a 10k-row exact query 24 ms instead of 0.5 ms
    # and HNSW adds 2.5x slower (measured on the 2-core dev machine under load).
    threads: int = 1


@contextmanager
def omp_threads(n: int) -> Iterator[None]:
    """Run faiss with ``n`` OpenMP threads inside the block, restoring the previous setting after."""
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def exact_knn(queries: np.ndarray, vectors: np.ndarray, k: int, threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force top-k inner products (``faiss.knn``): (scores, positions in ``vectors``), best first."""
    k = min(k, len(vectors))
    if k == 0:
        return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
    with omp_threads(threads):
        return faiss.knn(
            np.ascontiguousarray(queries, dtype=np.float32),
            np.ascontiguousarray(vectors, dtype=np.float32),
            k,
            metric=faiss.METRIC_INNER_PRODUCT,
        )


class VectorIndex:
    """A faiss index over rows ``0..ntotal-1`` that switches from exact to HNSW as it grows."""

    def __init__(self, dim: int, config: IndexConfig, index: faiss.Index | None = None) -> None:
        self.dim = dim
        self.config = config
        self.index: faiss.Index = index if index is not None else faiss.IndexFlatIP(dim)
        self.snapshot_rows = self.ntotal if self.is_hnsw else 0

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def is_hnsw(self) -> bool:
        return isinstance(self.index, faiss.IndexHNSWFlat)

    @property
    def kind(self) -> str:
        return "hnsw" if self.is_hnsw else "exact"

    def _new_hnsw(self) -> faiss.IndexHNSWFlat:
        index = faiss.IndexHNSWFlat(self.dim, self.config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = self.config.ef_construction
        return index

    def add(self, vectors: np.ndarray) -> None:
        """Append vectors (rows ``ntotal..``); converts to HNSW when the size passes ``exact_max_rows``."""
        if len(vectors) == 0:
            return
        if not self.is_hnsw and self.ntotal + len(vectors) > self.config.exact_max_rows:
            old = self.index.reconstruct_n(0, self.ntotal) if self.ntotal else np.zeros((0, self.dim), np.float32)
            log.info("replay index: switching to HNSW at %d rows", self.ntotal + len(vectors))
            self.index = self._new_hnsw()
            self.snapshot_rows = 0
            self._add_chunked(old)
        self._add_chunked(vectors)

    def _add_chunked(self, vectors: np.ndarray) -> None:
        with omp_threads(self.config.threads):
            for i in range(0, len(vectors), ADD_CHUNK):
                self.index.add(np.ascontiguousarray(vectors[i : i + ADD_CHUNK], dtype=np.float32))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores, ids) per query, best first; ids are -1 where fewer than k rows exist."""
        k = max(1, min(k, self.ntotal))
        if isinstance(self.index, faiss.IndexHNSWFlat):
            self.index.hnsw.efSearch = max(self.config.ef_search, k)
        with omp_threads(self.config.threads):
            scores, ids = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        return scores, ids

    # ---------------------------------------------------------------------------------------- snapshots

    def needs_snapshot(self) -> bool:
        stale = self.ntotal - self.snapshot_rows
        return self.is_hnsw and stale >= max(self.config.snapshot_min_rows, self.snapshot_rows // 4)

    def save(self, directory: Path) -> None:
        """Snapshot an HNSW index atomically (an exact index is cheaper to rebuild than to store)."""
        if not self.is_hnsw or self.snapshot_rows == self.ntotal:
            return
        path = directory / SNAPSHOT
        tmp = tmp_path(path)
        faiss.write_index(self.index, str(tmp))
        replace_durably(tmp, path)
        self.snapshot_rows = self.ntotal

    @classmethod
    def load(cls, directory: Path, embeddings: np.ndarray, config: IndexConfig, read_only: bool) -> VectorIndex:
        """The index for the stored ``embeddings``: the snapshot if it fits them, caught up with the rows it
        lacks; rebuilt (with a warning) when the snapshot is missing where one is expected, unreadable, or
        does not match the store."""
        rows, dim = embeddings.shape
        path = directory / SNAPSHOT
        snapshot: faiss.Index | None = None
        if rows > config.exact_max_rows and path.exists():
            snapshot = cls._read_snapshot(path, embeddings)
        if rows > config.exact_max_rows and snapshot is None:
            log.warning("%s: no usable index snapshot; rebuilding the index over %d rows", directory, rows)
        index = cls(dim, config, snapshot)
        index.add(embeddings[index.ntotal :])
        if not read_only and index.ntotal != index.snapshot_rows and snapshot is None:
            index.save(directory)
        return index

    @staticmethod
    def _read_snapshot(path: Path, embeddings: np.ndarray) -> faiss.Index | None:
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as e:
            log.warning("%s: unreadable index snapshot (%s)", path, str(e).splitlines()[0] if str(e) else "")
            return None
        n = int(index.ntotal)
        if not isinstance(index, faiss.IndexHNSWFlat) or index.d != embeddings.shape[1] or n > len(embeddings):
            log.warning("%s: index snapshot does not match the store (%d rows, d=%d)", path, n, index.d)
            return None
        # Rows are immutable once committed, so the last row the snapshot covers must equal the store's.
        if n and not np.array_equal(index.reconstruct(n - 1), embeddings[n - 1]):
            log.warning("%s: index snapshot holds other vectors than the store", path)
            return None
        return index

    def vectors(self, start: int, stop: int) -> np.ndarray:
        """The indexed vectors of rows ``start..stop-1`` (for consistency checks)."""
        return self.index.reconstruct_n(start, stop - start)
