"""The experience replay buffer: the experience model's memory of real and synthetic transitions.

Seeded with offline real trajectories and enriched with every synthetic one produced during RL; at each step
the experience model retrieves the top-k stored transitions whose φ(state, action) is most cosine-similar to
the current one's. Persistence and crash safety live in :mod:`~dreamgym.replay.store`, the ANN index in
:mod:`~dreamgym.replay.index`, φ in :mod:`~dreamgym.replay.encoder`.

Filters (``env``, ``source``, ``exclude_traj``, ``exclude_key``) are applied after the index search, which
over-fetches in proportion to how many rows the filter rejects; a query left with fewer than k hits (while more
exist) is answered by an exact search over the rows that pass. Filters that keep at most ``exact_max_rows`` rows are
always answered exactly. ``same_action_first`` puts the rows that took the query's very action (the store indexes
rows by action text) in front, ranked by exact cosine among them: the page an action opens is often the same from
wherever it was taken (a product's item page), and φ's nearest rows are mostly other actions on the same page.
``tasks`` (one task instruction per query) puts in front of those the rows recorded in the query's task that took its
action: what a TextWorld game hides until an action shows it (what its fridge holds) is the same whenever that game
takes the action, and φ of a dreamt state rarely finds the game's own rows (2 of 166 dreamt opens that the data never
took from that state, although it opened the same container in the same game for 126). Not thread-safe: one buffer
object per thread.

Duplicates are stored once, under the trajectory that added them first, so excluding a query's own trajectory
does not keep its own transition out when another trajectory holds the same one: ``exclude_key`` (a
:func:`~dreamgym.replay.record.transition_key`) excludes the rows holding that exact transition, wherever
they came from.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from dreamgym.replay.encoder import (
    CachedEncoder,
    Encoder,
    MiniLMEncoder,
    l2_normalise,
    make_encoder,
    phi_text,
)
from dreamgym.replay.index import IndexConfig, VectorIndex, exact_knn
from dreamgym.replay.record import ReplayRecord, Retrieved
from dreamgym.replay.store import StoreMeta, TransitionStore
from dreamgym.types import Trajectory

log = logging.getLogger(__name__)
EXACT_CHUNK = 262_144  # rows per brute-force pass in exact search (bounds the memory of a gather)
MAX_OVERFETCH = 4_096


class BufferStats(BaseModel):
    path: str
    encoder: str
    dim: int
    transitions: int
    trajectories: int
    by_env: dict[str, int]
    by_source: dict[str, int]
    by_iteration: dict[int, int]
    index: str
    index_rows: int
    snapshot_rows: int
    exact_fallbacks: int
    disk_bytes: int
    lost_rows: int = 0  # committed rows the data files no longer held when the buffer was opened (repaired)
    torn_bytes: int = 0  # bytes of an uncommitted batch dropped when the buffer was opened


class ReplayBuffer:
    """Persistent store of transitions + embeddings + faiss index in one directory. Use :meth:`open`."""

    def __init__(self, store: TransitionStore, index: VectorIndex, encoder: Encoder) -> None:
        self.store = store
        self.index = index
        self.encoder = encoder
        self.phi = CachedEncoder(encoder)  # a retrieved (s, a) is usually added later: encode it once
        self._subsets: dict[tuple[int | None, int | None], tuple[np.ndarray, np.ndarray]] = {}
        self.exact_fallbacks = 0  # filtered queries the index could not answer (since open)
        self.hidden_rows: set[int] = set()  # see hide_rows
        self._hidden_keys: set[bytes] = set()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        encoder: Encoder | None = None,
        *,
        create: bool = True,
        read_only: bool = False,
        config: IndexConfig | None = None,
    ) -> ReplayBuffer:
        """Open (or with ``create``, make) the buffer at ``path``.

        ``encoder=None`` uses the encoder recorded in the buffer (MiniLM for a new one); an encoder whose name
        differs from the recorded one is an error, since its vectors would not be comparable. ``read_only``
        opens without the writer lock: it sees the batches committed when it opened, even while a writer runs.
        """
        root = Path(path)
        stored = TransitionStore.read_meta(root)
        if encoder is None and stored is not None:
            name = stored.encoder
            try:
                encoder = make_encoder(name)
            except ValueError:
                raise ValueError(f"{root}: built with encoder {name!r}; pass that encoder to open it") from None
        encoder = encoder if encoder is not None else MiniLMEncoder()
        meta = StoreMeta(encoder=encoder.name, dim=encoder.dim) if create else None
        store = TransitionStore.open(root, meta, read_only)
        try:
            if (store.meta.encoder, store.meta.dim) != (encoder.name, encoder.dim):
                raise ValueError(
                    f"{root}: buffer was built with encoder {store.meta.encoder!r} (dim {store.meta.dim}), "
                    f"not {encoder.name!r} (dim {encoder.dim})"
                )
            index = VectorIndex.load(root, store.embeddings(), config or IndexConfig(), read_only)
        except BaseException:
            store.close()
            raise
        return cls(store, index, encoder)

    @property
    def path(self) -> Path:
        return self.store.path

    def __len__(self) -> int:
        return len(self.store)

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------- adding

    def add_trajectories(self, trajs: Iterable[Trajectory], iteration: int = -1) -> int:
        """Add every transition of ``trajs`` as one atomic batch; returns how many were new (not duplicates)."""
        return self.add_transitions(
            [r for traj in trajs for r in ReplayRecord.from_trajectory(traj, iteration=iteration)]
        )

    def add_transitions(self, records: Sequence[ReplayRecord]) -> int:
        """Embed the records that are not exact duplicates and commit them as one batch; returns that count."""
        fresh, keys = self._dedup(records)
        if not fresh:
            return 0
        embeddings = self.phi.encode([phi_text(r.state, r.action) for r in fresh])
        self._commit(fresh, keys, embeddings)
        return len(fresh)

    def add_embedded(self, records: Sequence[ReplayRecord], embeddings: np.ndarray) -> int:
        """Like :meth:`add_transitions` with precomputed φ (``len(records) x dim``; rows are L2-normalised)."""
        emb = np.asarray(embeddings, dtype=np.float32)
        if emb.shape != (len(records), self.store.meta.dim):
            raise ValueError(f"embeddings have shape {emb.shape}, expected ({len(records)}, {self.store.meta.dim})")
        if not np.isfinite(emb).all():
            raise ValueError("embeddings contain NaN or inf")
        keep: list[int] = []
        fresh, keys = self._dedup(records, keep)
        if fresh:
            self._commit(fresh, keys, l2_normalise(emb[keep]))
        return len(fresh)

    def hide_rows(self, start: int, stop: int) -> int:
        """Hide rows ``start..stop-1`` from retrieval and from duplicate suppression, for this open buffer.

        For the transitions a killed training run wrote after its last checkpoint: the resumed run redoes that
        work, so it must neither retrieve them nor have its own identical transitions dropped as duplicates.
        The rows stay on disk (the store is append-only). Returns how many rows were hidden.
        """
        rows = range(max(0, start), min(stop, len(self)))
        self.hidden_rows.update(rows)
        self._hidden_keys.update(self.record(r).key() for r in rows)
        return len(rows)

    def _dedup(
        self, records: Sequence[ReplayRecord], keep: list[int] | None = None
    ) -> tuple[list[ReplayRecord], list[bytes]]:
        fresh: list[ReplayRecord] = []
        keys: list[bytes] = []
        seen: set[bytes] = set()
        for i, record in enumerate(records):
            key = record.key()
            if key in seen or (key in self.store and key not in self._hidden_keys):
                continue
            self._hidden_keys.discard(key)  # added again: from now on an ordinary duplicate key
            seen.add(key)
            fresh.append(record)
            keys.append(key)
            if keep is not None:
                keep.append(i)
        return fresh, keys

    def _commit(self, records: list[ReplayRecord], keys: list[bytes], embeddings: np.ndarray) -> None:
        rows = len(self.store)
        try:
            self.store.append(records, keys, embeddings)
        finally:
            if len(self.store) != rows:  # committed (even when the store then raised): index it
                self._subsets.clear()
                self.index.add(embeddings)
        if self.index.needs_snapshot():
            self.index.save(self.path)

    # ------------------------------------------------------------------------------------------- retrieval

    def retrieve(
        self,
        state: str,
        action: str,
        k: int = 8,
        *,
        env: str | None = None,
        exclude_traj: str | None = None,
        source: str | None = None,
        exclude_key: bytes | None = None,
        keep_key: bytes | None = None,
        same_action_first: bool = False,
        task: str | None = None,
    ) -> list[Retrieved]:
        """The k stored transitions most similar to (state, action), best first."""
        return self.retrieve_batch([(state, action)], k, env=env, exclude_traj=[exclude_traj], source=source,
                                   exclude_key=[exclude_key], keep_key=[keep_key],
                                   same_action_first=same_action_first, tasks=None if task is None else [task])[0]

    def retrieve_batch(
        self,
        queries: Sequence[tuple[str, str]],
        k: int = 8,
        *,
        env: str | None = None,
        exclude_traj: Sequence[str | None] | None = None,
        source: str | None = None,
        exclude_key: Sequence[bytes | None] | None = None,
        keep_key: Sequence[bytes | None] | None = None,
        same_action_first: bool = False,
        tasks: Sequence[str] | None = None,
    ) -> list[list[Retrieved]]:
        """:meth:`retrieve` for many (state, action) queries in one encoder call and one index search.

        ``exclude_traj`` gives one trajectory id (or None) per query, e.g. each episode's own; ``exclude_key``
        one transition key (or None) per query, e.g. the key of the transition the query is for; ``keep_key`` one
        key (or None) per query whose stored copy stays retrievable even when it lies in ``exclude_traj``
        (duplicates are stored once, under the first trajectory that added them: a transition another trajectory
        also recorded is that trajectory's too). ``same_action_first``: the stored transitions that took the
        query's very action (the same text) come first, most similar first, then the rest by similarity. ``tasks``
        (one task instruction per query): before those, the ones recorded in the query's task, its real ones first
        (a dream's online rows of the task come after what the game itself showed)
        """
        if not queries:
            return []
        embeddings = self.phi.encode([phi_text(s, a) for s, a in queries])
        return self.search(embeddings, k, env=env, exclude_traj=exclude_traj, source=source, exclude_key=exclude_key,
                           keep_key=keep_key, actions=[a for _, a in queries] if same_action_first else None,
                           task_actions=None if tasks is None else list(zip(tasks, [a for _, a in queries],
                                                                            strict=True)))

    def search(
        self,
        embeddings: np.ndarray,
        k: int = 8,
        *,
        env: str | None = None,
        exclude_traj: Sequence[str | None] | None = None,
        source: str | None = None,
        exclude_key: Sequence[bytes | None] | None = None,
        keep_key: Sequence[bytes | None] | None = None,
        actions: Sequence[str] | None = None,
        task_actions: Sequence[tuple[str, str]] | None = None,
    ) -> list[list[Retrieved]]:
        """Retrieval for precomputed query embeddings (``n x dim``, unit rows)."""
        hits = self.search_rows(embeddings, k, env=env, exclude_traj=exclude_traj, source=source,
                                exclude_key=exclude_key, keep_key=keep_key, actions=actions, task_actions=task_actions)
        return [
            [Retrieved(**self.store.record(row).model_dump(), score=score, row=row) for row, score in q]
            for q in hits
        ]

    def search_rows(
        self,
        embeddings: np.ndarray,
        k: int = 8,
        *,
        env: str | None = None,
        exclude_traj: Sequence[str | None] | None = None,
        source: str | None = None,
        exclude_key: Sequence[bytes | None] | None = None,
        keep_key: Sequence[bytes | None] | None = None,
        actions: Sequence[str] | None = None,
        task_actions: Sequence[tuple[str, str]] | None = None,
    ) -> list[list[tuple[int, float]]]:
        """Like :meth:`search` but returns (row, cosine) pairs without reading the records. ``actions`` (one per
        query): the rows that took that very action come first (:meth:`retrieve_batch`'s ``same_action_first``);
        ``task_actions`` (one (task instruction, action) per query): before them, the rows of that task and action
        (its ``tasks``)."""
        queries = np.atleast_2d(np.asarray(embeddings, dtype=np.float32))
        if queries.shape[1] != self.store.meta.dim:
            raise ValueError(f"query embeddings have dim {queries.shape[1]}, buffer has {self.store.meta.dim}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        excludes = list(exclude_traj) if exclude_traj is not None else [None] * len(queries)
        keys = list(exclude_key) if exclude_key is not None else [None] * len(queries)
        kept = list(keep_key) if keep_key is not None else [None] * len(queries)
        named = [("exclude_traj", excludes), ("exclude_key", keys), ("keep_key", kept)]
        optional = [("actions", actions), ("task_actions", task_actions)]
        for name, given in [*named, *((n, g) for n, g in optional if g is not None)]:
            if len(given) != len(queries):
                raise ValueError(f"{name} has {len(given)} entries for {len(queries)} queries")
        env_code = self.store.envs.codes.get(env, -1) if env is not None else None
        source_code = self.store.sources.codes.get(source, -1) if source is not None else None
        passing = self._count_passing(env_code, source_code)
        excluded = [self._excluded_rows(t, key, keep, env_code, source_code)
                    for t, key, keep in zip(excludes, keys, kept, strict=True)]
        if passing == 0:
            return [[] for _ in excludes]
        filtered = env is not None or source is not None
        if filtered and passing <= self.index.config.exact_max_rows:
            out = [self._exact(q, k, env_code, source_code, ex) for q, ex in zip(queries, excluded, strict=True)]
        else:
            out = self._approximate(queries, k, env_code, source_code, excluded, filtered, passing)
        # the last put in front comes first: the task's rows of the action, then the action's rows, then the rest
        if actions is not None:
            self._put_first(queries, actions, self.store.action_rows, k, out, env_code, source_code, excluded)
        if task_actions is not None:  # the real rows of the task's action first: what the game showed, not a dream
            self._put_first(queries, task_actions, self.store.task_action_rows, k, out, env_code, source_code,
                            excluded, first_source=self.store.sources.codes.get("real", -1))
        return out

    def _approximate(
        self, queries: np.ndarray, k: int, env_code: int | None, source_code: int | None, excluded: list[set[int]],
        filtered: bool, passing: int,
    ) -> list[list[tuple[int, float]]]:
        """Top-k by the index, filters applied to its candidates (see the module docstring)."""
        # Over-fetch in proportion to what the filter rejects; queries left short retry with 4x the candidates,
        # then (past MAX_OVERFETCH) fall back to exact search.
        n = len(self)
        fetch = k + max(len(ex) for ex in excluded)
        if filtered:
            fetch = int(fetch * n / passing * 2) + 16
        out: list[list[tuple[int, float]]] = [[] for _ in excluded]
        pending = list(range(len(queries)))
        while pending:
            fetch = min(n, MAX_OVERFETCH, fetch)
            scores, ids = self.index.search(queries[pending], fetch)
            short = []
            for qi, row_ids, row_scores in zip(pending, ids, scores, strict=True):
                hits = self._filter_hits(row_ids, row_scores, env_code, source_code, excluded[qi])
                if len(hits) >= min(k, passing - len(excluded[qi])):
                    out[qi] = hits[:k]
                else:
                    short.append(qi)
            if short and fetch == min(n, MAX_OVERFETCH):
                for qi in short:
                    self.exact_fallbacks += 1
                    log.debug("replay: too few index hits passed the filter; exact search instead")
                    out[qi] = self._exact(queries[qi], k, env_code, source_code, excluded[qi])
                break
            pending, fetch = short, fetch * 4
        return out

    def _put_first(
        self, queries: np.ndarray, groups: Sequence[Any], rows_of: dict[Any, list[int]], k: int,
        out: list[list[tuple[int, float]]], env_code: int | None, source_code: int | None, excluded: list[set[int]],
        first_source: int | None = None,
    ) -> None:
        """Put in front of each query's hits (in place) its best k rows among ``rows_of[its group]`` (the rows that
        took its action, or its task's rows of that action), by exact cosine over those rows (the queries of one
        group share one gather), filters and exclusions applied; with ``first_source`` (a source code) the rows of
        that source before the others."""
        vectors = self.store.embeddings()
        by_group: dict[Any, list[int]] = {}
        for qi, group in enumerate(groups):
            by_group.setdefault(group, []).append(qi)
        for group, qis in by_group.items():
            rows = np.asarray(rows_of.get(group, ()), dtype=np.int64)
            ok = np.ones(rows.size, dtype=bool)
            if env_code is not None:
                ok &= self.store.env_codes.values[rows] == env_code
            if source_code is not None:
                ok &= self.store.source_codes.values[rows] == source_code
            rows = rows[ok]
            if rows.size == 0:
                continue
            scores = queries[qis] @ np.asarray(vectors[rows]).T
            other = (np.zeros(rows.size, dtype=bool) if first_source is None
                     else self.store.source_codes.values[rows] != first_source)
            for j, qi in enumerate(qis):
                same: list[tuple[int, float]] = []
                for p in np.lexsort((-scores[j], other)):  # the first source first, then by similarity
                    if int(rows[p]) not in excluded[qi]:
                        same.append((int(rows[p]), float(scores[j, p])))
                        if len(same) == k:
                            break
                taken = {row for row, _ in same}
                out[qi] = (same + [h for h in out[qi] if h[0] not in taken])[:k]

    def _filter_hits(
        self, row_ids: np.ndarray, row_scores: np.ndarray, env_code: int | None, source_code: int | None, ex: set[int]
    ) -> list[tuple[int, float]]:
        """The (row, score) candidates of one query that pass the filters, in the index's order."""
        ok = row_ids >= 0
        safe = np.maximum(row_ids, 0)
        if env_code is not None:
            ok &= self.store.env_codes.values[safe] == env_code
        if source_code is not None:
            ok &= self.store.source_codes.values[safe] == source_code
        return [(int(r), float(s)) for r, s in zip(row_ids[ok], row_scores[ok], strict=True) if int(r) not in ex]

    def _count_passing(self, env_code: int | None, source_code: int | None) -> int:
        return sum(
            c
            for (e, s), c in self.store.counts.items()
            if (env_code is None or e == env_code) and (source_code is None or s == source_code)
        )

    def _excluded_rows(
        self, traj_id: str | None, key: bytes | None, keep: bytes | None, env_code: int | None,
        source_code: int | None,
    ) -> set[int]:
        """Rows of ``traj_id`` (but those holding the transition ``keep``), rows holding the transition ``key``,
        and hidden rows, that would otherwise pass the filter."""
        code = self.store.trajs.codes.get(traj_id) if traj_id is not None else None
        rows = set(self.store.traj_rows[code]) if code is not None else set()
        if keep is not None:
            rows.difference_update(self.store.rows_of_key(keep))
        if key is not None:
            rows.update(self.store.rows_of_key(key))
        return {
            r
            for r in rows | self.hidden_rows
            if (env_code is None or self.store.env_codes.values[r] == env_code)
            and (source_code is None or self.store.source_codes.values[r] == source_code)
        }

    def _subset(self, env_code: int | None, source_code: int | None) -> tuple[np.ndarray, np.ndarray | None]:
        """Rows passing the filter and, for small subsets, their vectors (cached until the next add)."""
        if env_code is None and source_code is None:
            return np.arange(len(self)), None
        cached = self._subsets.get((env_code, source_code))
        if cached is not None:
            return cached
        mask = np.ones(len(self), dtype=bool)
        if env_code is not None:
            mask &= self.store.env_codes.values == env_code
        if source_code is not None:
            mask &= self.store.source_codes.values == source_code
        rows = np.flatnonzero(mask)
        if len(rows) > self.index.config.exact_max_rows:
            return rows, None
        subset = (rows, np.ascontiguousarray(self.store.embeddings()[rows]))
        self._subsets[env_code, source_code] = subset
        return subset

    def _exact(
        self, query: np.ndarray, k: int, env_code: int | None, source_code: int | None, excluded: set[int]
    ) -> list[tuple[int, float]]:
        """Brute-force top-k cosine over the rows passing the filter, in chunks of ``EXACT_CHUNK`` rows."""
        rows, vectors = self._subset(env_code, source_code)
        unfiltered = env_code is None and source_code is None
        all_vectors = self.store.embeddings()
        hits: list[tuple[int, float]] = []
        for start in range(0, len(rows), EXACT_CHUNK):
            chunk = rows[start : start + EXACT_CHUNK]
            if vectors is not None:
                mat = vectors[start : start + EXACT_CHUNK]
            else:  # a slice of the memory map when unfiltered, a gather otherwise
                mat = all_vectors[start : start + EXACT_CHUNK] if unfiltered else all_vectors[chunk]
            scores, pos = exact_knn(query[None, :], mat, k + len(excluded), self.index.config.threads)
            hits.extend((int(chunk[p]), float(s)) for p, s in zip(pos[0], scores[0], strict=True))
        hits = [h for h in hits if h[0] not in excluded]
        return sorted(hits, key=lambda h: -h[1])[:k]

    # --------------------------------------------------------------------------------------- maintenance

    def record(self, row: int) -> ReplayRecord:
        return self.store.record(row)

    def stats(self) -> BufferStats:
        store = self.store
        return BufferStats(
            path=str(self.path),
            encoder=store.meta.encoder,
            dim=store.meta.dim,
            transitions=len(store),
            trajectories=len(store.trajs.names),
            by_env={store.envs.names[e]: c for e, c in self._sum_counts(0).items()},
            by_source={store.sources.names[s]: c for s, c in self._sum_counts(1).items()},
            by_iteration=dict(sorted(store.iterations.items())),
            index=self.index.kind,
            index_rows=self.index.ntotal,
            snapshot_rows=self.index.snapshot_rows,
            exact_fallbacks=self.exact_fallbacks,
            disk_bytes=store.disk_bytes(),
            lost_rows=store.lost_rows,
            torn_bytes=store.torn_bytes,
        )

    def _sum_counts(self, axis: int) -> dict[int, int]:
        out: dict[int, int] = {}
        for key, c in self.store.counts.items():
            out[key[axis]] = out.get(key[axis], 0) + c
        return out

    def check(self, sample: int = 1_000) -> None:
        """Raise ``RuntimeError`` if the index does not cover exactly the stored rows with the stored vectors."""
        n = len(self)
        if self.index.ntotal != n:
            raise RuntimeError(f"{self.path}: index covers {self.index.ntotal} rows, store has {n}")
        rows = np.unique(np.linspace(0, n - 1, num=min(n, sample)).astype(np.int64))
        stored = self.store.embeddings()
        for row in rows:
            if not np.array_equal(self.index.vectors(int(row), int(row) + 1)[0], stored[row]):
                raise RuntimeError(f"{self.path}: index vector of row {row} differs from the stored one")

    def flush(self) -> None:
        """Snapshot the index now (it is also snapshotted on close and as it grows)."""
        if not self.store.read_only:
            self.index.save(self.path)

    def close(self) -> None:
        """Snapshot the index (writers) and release the files and the writer lock. Idempotent."""
        if self.store.is_open and not self.store.read_only:
            self.index.save(self.path)
        self.store.close()
