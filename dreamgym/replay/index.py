"""The faiss index over the stored embeddings: top-k by inner product of unit vectors, i.e. cosine.

Index ids are store rows (vectors are added in row order). The kind follows the size:

* up to ``exact_max_rows`` rows, exact search (``IndexFlatIP``): under a millisecond at 10k rows, no recall
  loss, and nothing to persist (it is rebuilt from ``embeddings.f32`` on open in well under a second);
* above, by default IVF (``IndexIVFFlat``, inner product, spherical k-means): an add only assigns each vector
  to its nearest of ``nlist ≈ 4·sqrt(rows)`` centroids, so adds stay cheap at any size, and a query scans
  ``nprobe`` lists. The centroids fit the rows present when the index is trained, so it is re-trained
  (centroids re-fitted on a sample, rows re-assigned) each time the buffer grows 4x (``nlist`` doubles): this
  follows the buffer as synthetic experience shifts its distribution, at an amortised O(1) cost per add (the
  add that triggers it waits, ~1 min at 500k rows on one core). Measured side by side on 2 shared cores,
  1 thread (``benchmarks/bench_replay.py``, adds excluding embedding): IVF adds 10.9k/s to 100k rows and
  4.7k/s to 1M (re-trainings included) against HNSW's 1.2k/s and ~1k/s (graph insertion was 93% of its add
  time); top-8 p50 0.46 ms at 100k (recall@8 0.90 vs HNSW's 0.99: raise ``ivf_nprobe`` for more) and
  0.79 ms at 1M (recall@8 1.00 vs HNSW's 0.93). Adds dominate a growing buffer's cost, hence the default;
* ``approximate="hnsw"`` keeps HNSW (``IndexHNSWFlat``): no training and the best recall per millisecond, but
  slow adds.

Approximate indexes take minutes to build at 1M rows, so they are snapshotted (``index.faiss``, atomically)
and on open only the rows the snapshot lacks are added; a missing, unreadable or mismatched snapshot is
rebuilt from the stored embeddings.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import faiss
import numpy as np
from pydantic import BaseModel, ConfigDict

from dreamgym.replay.files import replace_durably, tmp_path

log = logging.getLogger(__name__)
SNAPSHOT = "index.faiss"
ADD_CHUNK = 65_536
ApproximateKind = Literal["ivf", "hnsw"]


class IndexConfig(BaseModel):
    """How the index is built and searched (not stored in the buffer: pass it on every open)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exact_max_rows: int = 20_000
    approximate: ApproximateKind = "ivf"  # the index above exact_max_rows
    # IVF: nlist = ivf_lists_per_sqrt_row * sqrt(rows) when (re-)trained, on ivf_train_per_list sampled rows per
    # list (faiss's minimum is 39); queries scan ivf_nprobe lists (more when k needs more candidates).
    ivf_lists_per_sqrt_row: float = 4.0
    ivf_train_per_list: int = 40
    ivf_nprobe: int = 32
    hnsw_m: int = 32
    ef_construction: int = 40
    ef_search: int = 128
    # Snapshot an approximate index once this many rows (and at least a quarter of the snapshot) are not in it:
    # bounds the catch-up work on open while keeping snapshot writes (O(rows) each) amortised O(1) per add.
    snapshot_min_rows: int = 50_000
    # OpenMP threads faiss may use for the buffer's adds and searches. A top-8 query gains nothing from
    # threads, and on shared CPUs spinning OpenMP threads made a 10k-row exact query 24 ms instead of 0.5 ms
    # and HNSW adds 2.5x slower (measured on the 2-core dev machine under load).
    threads: int = 1

    def ivf_lists(self, rows: int) -> int:
        """The number of IVF lists for an index trained at ``rows`` rows (each list gets enough training rows)."""
        return max(1, min(round(self.ivf_lists_per_sqrt_row * math.sqrt(rows)), rows // self.ivf_train_per_list))


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


def index_kind(index: faiss.Index) -> str:
    if isinstance(index, faiss.IndexIVFFlat):
        return "ivf"
    if isinstance(index, faiss.IndexHNSWFlat):
        return "hnsw"
    return "exact"


class VectorIndex:
    """A faiss index over rows ``0..ntotal-1`` that switches from exact to IVF (or HNSW) as it grows."""

    def __init__(self, dim: int, config: IndexConfig, index: faiss.Index | None = None) -> None:
        self.dim = dim
        self.config = config
        self.index: faiss.Index = index if index is not None else faiss.IndexFlatIP(dim)
        self.snapshot_rows = self.ntotal if self.is_approximate else 0
        self.retrains = 0  # IVF re-trainings (since open)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def kind(self) -> str:
        return index_kind(self.index)

    @property
    def is_approximate(self) -> bool:
        return self.kind != "exact"

    def _needs_rebuild(self, rows: int) -> bool:
        """Whether ``rows`` rows call for a new index: past the exact threshold, or an IVF grown 4x since trained."""
        if not self.is_approximate:
            return rows > self.config.exact_max_rows
        if isinstance(self.index, faiss.IndexIVFFlat):
            return self.config.ivf_lists(rows) >= 2 * self.index.nlist
        return False

    def _new_approximate(self, old: np.ndarray, new: np.ndarray) -> faiss.Index:
        """An empty HNSW index, or an IVF index trained on a sample of the ``old`` and ``new`` rows."""
        if self.config.approximate == "hnsw":
            hnsw = faiss.IndexHNSWFlat(self.dim, self.config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            hnsw.hnsw.efConstruction = self.config.ef_construction
            return hnsw
        rows = len(old) + len(new)
        nlist = self.config.ivf_lists(rows)
        pick = np.random.default_rng(rows).choice(rows, size=min(rows, nlist * self.config.ivf_train_per_list), replace=False)
        pick.sort()
        split = int(np.searchsorted(pick, len(old)))
        sample = np.concatenate([old[pick[:split]], new[pick[split:] - len(old)]]).astype(np.float32, copy=False)
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(self.dim), self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        with omp_threads(self.config.threads):
            ivf.train(np.ascontiguousarray(sample))  # spherical k-means for inner product
        ivf.make_direct_map()  # reconstruct(row): snapshot validation and consistency checks
        return ivf

    def add(self, vectors: np.ndarray) -> None:
        """Append vectors (rows ``ntotal..``); builds a new index past ``exact_max_rows`` and as IVF outgrows
        its lists (re-adding the rows already indexed)."""
        if len(vectors) == 0:
            return
        rows = self.ntotal + len(vectors)
        if self._needs_rebuild(rows):
            old = self.index.reconstruct_n(0, self.ntotal) if self.ntotal else np.zeros((0, self.dim), np.float32)
            self.index = self._new_approximate(old, vectors)
            log.info("replay index: built %s at %d rows", self._describe(), rows)
            if self.kind == "ivf":
                self.retrains += 1
            self.snapshot_rows = 0
            self._add_chunked(old)
        self._add_chunked(vectors)

    def _describe(self) -> str:
        return f"IVF with {self.index.nlist} lists" if isinstance(self.index, faiss.IndexIVFFlat) else self.kind

    def _add_chunked(self, vectors: np.ndarray) -> None:
        with omp_threads(self.config.threads):
            for i in range(0, len(vectors), ADD_CHUNK):
                self.index.add(np.ascontiguousarray(vectors[i : i + ADD_CHUNK], dtype=np.float32))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (scores, ids) per query, best first; ids are -1 where fewer than k rows exist (or, for IVF,
        where the probed lists hold fewer than k rows)."""
        k = max(1, min(k, self.ntotal))
        if isinstance(self.index, faiss.IndexHNSWFlat):
            self.index.hnsw.efSearch = max(self.config.ef_search, k)
        elif isinstance(self.index, faiss.IndexIVFFlat):
            # Probe enough lists to hold ~2k candidates on average, so large (over-fetching) k still fills up.
            lists_for_k = math.ceil(2 * k * self.index.nlist / self.ntotal)
            self.index.nprobe = min(self.index.nlist, max(self.config.ivf_nprobe, lists_for_k))
        with omp_threads(self.config.threads):
            scores, ids = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        return scores, ids

    # ---------------------------------------------------------------------------------------- snapshots

    def needs_snapshot(self) -> bool:
        stale = self.ntotal - self.snapshot_rows
        return self.is_approximate and stale >= max(self.config.snapshot_min_rows, self.snapshot_rows // 4)

    def save(self, directory: Path) -> None:
        """Snapshot an approximate index atomically (an exact index is cheaper to rebuild than to store)."""
        if not self.is_approximate or self.snapshot_rows == self.ntotal:
            return
        path = directory / SNAPSHOT
        tmp = tmp_path(path)
        faiss.write_index(self.index, str(tmp))
        replace_durably(tmp, path)
        self.snapshot_rows = self.ntotal

    @classmethod
    def load(cls, directory: Path, embeddings: np.ndarray, config: IndexConfig, read_only: bool) -> VectorIndex:
        """The index for the stored ``embeddings``: the snapshot if it fits them, caught up with the rows it
        lacks; rebuilt (with a warning) when the snapshot is missing where one is expected, unreadable, of
        another kind than ``config.approximate``, or does not match the store."""
        rows, dim = embeddings.shape
        path = directory / SNAPSHOT
        snapshot: faiss.Index | None = None
        if rows > config.exact_max_rows and path.exists():
            snapshot = cls._read_snapshot(path, embeddings, config)
        if rows > config.exact_max_rows and snapshot is None:
            log.warning("%s: no usable index snapshot; rebuilding the index over %d rows", directory, rows)
        index = cls(dim, config, snapshot)
        index.add(embeddings[index.ntotal :])
        if not read_only and index.ntotal != index.snapshot_rows and snapshot is None:
            index.save(directory)
        return index

    @staticmethod
    def _read_snapshot(path: Path, embeddings: np.ndarray, config: IndexConfig) -> faiss.Index | None:
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as e:
            log.warning("%s: unreadable index snapshot (%s)", path, str(e).splitlines()[0] if str(e) else "")
            return None
        n, kind = int(index.ntotal), index_kind(index)
        if kind != config.approximate:
            log.warning("%s: index snapshot is %s, the config asks for %s", path, kind, config.approximate)
            return None
        if index.d != embeddings.shape[1] or n > len(embeddings):
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
