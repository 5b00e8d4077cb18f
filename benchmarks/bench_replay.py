"""Replay-buffer benchmark: top-8 query latency and recall at growing sizes, add throughput, encoder speed.

One buffer per approximate index (IVF, HNSW) grows through the sizes (default 10k, 100k, 1M transitions); at each size it measures single-query
latency (index search only, and with the 8 records read back), batched latency, filtered latency, and recall@8
of the index against exact brute force. Embeddings are precomputed: random but clustered 384-d unit vectors
(cluster centres plus a shared low-rank variation, like text embeddings), so add throughput excludes encoding.
The encoders are timed separately on realistic shop (state, action) texts.

    .venv/bin/python benchmarks/bench_replay.py                      # the full run (~10 min on 2 cores)
    .venv/bin/python benchmarks/bench_replay.py --sizes 10000 100000  # quicker
    .venv/bin/python benchmarks/bench_replay.py --indexes ivf        # IVF only (HNSW: --hnsw-max-rows)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from dreamgym.replay import HashingEncoder, IndexConfig, MiniLMEncoder, ReplayBuffer, ReplayRecord, phi_text
from dreamgym.replay.index import omp_threads

K = 8
STATE = "[1] text: Page 1 (results 1-5 of 50)\n" + "\n".join(
    f"[{i}] link: B07ABC{i} — Red Cotton T-Shirt, Slim Fit | $24.99" for i in range(2, 9)
)


class ClusteredEmbeddings:
    """Unit vectors = cluster centre + variation in a shared low-rank subspace + a little isotropic noise."""

    def __init__(self, dim: int, clusters: int = 2_000, rank: int = 32, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.centres = self.rng.standard_normal((clusters, dim)).astype(np.float32) / np.sqrt(dim)
        self.basis = self.rng.standard_normal((rank, dim)).astype(np.float32) / np.sqrt(dim)

    def sample(self, n: int) -> np.ndarray:
        labels = self.rng.integers(0, len(self.centres), n)
        z = 0.12 * self.rng.standard_normal((n, len(self.basis))).astype(np.float32)
        noise = 0.05 * self.rng.standard_normal((n, self.centres.shape[1])).astype(np.float32)
        x = self.centres[labels] + z @ self.basis + noise / np.sqrt(self.centres.shape[1])
        return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_records(start: int, n: int) -> list[ReplayRecord]:
    """Shop-sized records: 10 steps per trajectory, two envs (50/50), 10% synthetic."""
    return [
        ReplayRecord(
            traj_id=f"traj{i // 10}", task_id=f"task{i // 40}", instruction="i want a red cotton t-shirt under $30",
            env="shop" if (i // 10) % 2 == 0 else "web", source="synthetic" if (i // 10) % 10 == 9 else "real",
            iteration=-1, step=i % 10, state=f"{STATE}\n[9] text: row {i}", action=f"click[b07abc{i}]",
            next_state=f"[1] text: item {i}", reward=0.0, done=i % 10 == 9,
        )
        for i in range(start, start + n)
    ]


def exact_topk(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Brute-force top-k rows, in chunks (the memory map may not fit twice in RAM)."""
    best_s = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(queries), 0), dtype=np.int64)
    for start in range(0, len(vectors), 200_000):
        s = queries @ np.asarray(vectors[start : start + 200_000]).T
        cand_s, cand_i = np.concatenate([best_s, s], axis=1), np.concatenate(
            [best_i, np.broadcast_to(np.arange(start, start + s.shape[1]), s.shape)], axis=1
        )
        top = np.argsort(-cand_s, axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(cand_s, top, 1), np.take_along_axis(cand_i, top, 1)
    return best_i


def latency_ms(fn: Any, items: list[Any]) -> dict[str, float]:
    times = []
    for item in items:
        t = time.perf_counter()
        fn(item)
        times.append((time.perf_counter() - t) * 1e3)
    arr = np.array(times)
    return {"mean": float(arr.mean()), "p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95))}


def recall_and_gap(got: list[list[int]], truth: np.ndarray, vectors: np.ndarray, queries: np.ndarray) -> tuple[float, float]:
    """recall@k against exact search, and how much lower the mean cosine of the hits is than the exact one's."""
    recall = float(np.mean([len(set(g) & set(t.tolist())) / K for g, t in zip(got, truth, strict=True)]))
    gap = float(np.mean([(vectors[t] @ q).mean() - (vectors[g] @ q).mean() for g, t, q in zip(got, truth, queries, strict=True)]))
    return recall, gap


def ef_search_sweep(buf: ReplayBuffer, queries: np.ndarray, truth: np.ndarray) -> list[dict[str, float]]:
    """Recall and latency of the HNSW index at several efSearch (the buffer's default is IndexConfig.ef_search)."""
    index = buf.index.index
    assert isinstance(index, faiss.IndexHNSWFlat)

    def set_ef(ef: int) -> None:
        index.hnsw.efSearch = ef

    return knob_sweep(index, "ef_search", (32, 64, 128, 256), set_ef, buf, queries, truth)


def nprobe_sweep(buf: ReplayBuffer, queries: np.ndarray, truth: np.ndarray) -> list[dict[str, float]]:
    """Recall and latency of the IVF index at several nprobe (the buffer's default is IndexConfig.ivf_nprobe)."""
    index = buf.index.index
    assert isinstance(index, faiss.IndexIVFFlat)

    def set_nprobe(nprobe: int) -> None:
        index.nprobe = nprobe

    return knob_sweep(index, "nprobe", (8, 16, 32, 64), set_nprobe, buf, queries, truth)


def knob_sweep(
    index: faiss.Index, name: str, values: tuple[int, ...], set_knob: Any, buf: ReplayBuffer, queries: np.ndarray,
    truth: np.ndarray,
) -> list[dict[str, float]]:
    """Search the raw faiss index with each value of one search-time knob: recall@8, cosine gap, p50 latency."""
    vectors = buf.store.embeddings()
    rows = []
    with omp_threads(buf.index.config.threads):
        for value in values:
            set_knob(value)
            lat = latency_ms(lambda q: index.search(q, K), [queries[i : i + 1] for i in range(len(queries))])
            got = [list(r) for r in index.search(queries, K)[1]]
            recall, gap = recall_and_gap(got, truth, vectors, queries)
            rows.append({name: value, "recall_at_8": recall, "cosine_gap": gap, "p50_ms": lat["p50"]})
    return rows


def measure_size(buf: ReplayBuffer, gen: ClusteredEmbeddings, n_queries: int) -> dict[str, Any]:
    queries = gen.sample(n_queries)
    singles = [queries[i : i + 1] for i in range(n_queries)]
    few = singles[: min(200, n_queries)]
    truth = exact_topk(buf.store.embeddings(), queries[:200], K)
    got = [[r for r, _ in hits] for hits in buf.search_rows(queries[:200], K)]
    recall, gap = recall_and_gap(got, truth, buf.store.embeddings(), queries[:200])
    batch = 64
    t = time.perf_counter()
    for i in range(0, n_queries, batch):
        buf.search_rows(queries[i : i + batch], K)
    batched = (time.perf_counter() - t) * 1e3 / n_queries
    fallbacks = buf.exact_fallbacks
    row = {
        "rows": len(buf),
        "index": buf.index.kind,
        "recall_at_8": recall,
        "cosine_gap": gap,
        "query_ms": latency_ms(lambda q: buf.search_rows(q, K), singles),
        "query_with_records_ms": latency_ms(lambda q: buf.search(q, K), few),
        "query_batched_per_query_ms": batched,
        "query_exclude_traj_ms": latency_ms(lambda q: buf.search_rows(q, K, exclude_traj=["traj3"]), few),
        "query_env_filter_50pct_ms": latency_ms(lambda q: buf.search_rows(q, K, env="web"), few),
        "query_source_filter_10pct_ms": latency_ms(lambda q: buf.search_rows(q, K, source="synthetic"), few),
        "filtered_exact_fallbacks": buf.exact_fallbacks - fallbacks,
    }
    if buf.index.kind == "hnsw":
        row["ef_search_sweep"] = ef_search_sweep(buf, queries[:200], truth)
    if isinstance(buf.index.index, faiss.IndexIVFFlat):
        row["ivf_lists"] = buf.index.index.nlist
        row["nprobe_sweep"] = nprobe_sweep(buf, queries[:200], truth)
    return row


def bench_encoders(n_texts: int) -> dict[str, Any]:
    from dreamgym.collect import iter_episodes
    from dreamgym.envs import make
    from dreamgym.envs.shop.policies import make_policy

    texts: list[str] = []
    for traj in iter_episodes(make("shop", num_products=200), make_policy("noisy", seed=0), 10 * n_texts):
        texts.extend(phi_text(x.state, x.action) for x in traj.transitions)
        if len(texts) >= n_texts:
            break
    texts = texts[:n_texts]
    out: dict[str, Any] = {"texts": len(texts), "mean_chars": float(np.mean([len(t) for t in texts]))}
    import torch

    t = time.perf_counter()
    minilm = MiniLMEncoder()
    minilm.encode(texts[:8])
    out["minilm_load_s"] = time.perf_counter() - t
    for threads in (1, 2):
        torch.set_num_threads(threads)
        t = time.perf_counter()
        minilm.encode(texts)
        out[f"minilm_texts_per_s_{threads}_threads"] = len(texts) / (time.perf_counter() - t)
    t = time.perf_counter()
    HashingEncoder().encode(texts)
    out["hashing_texts_per_s"] = len(texts) / (time.perf_counter() - t)
    return out


def bench_index(kind: str, sizes: list[int], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Grow one buffer (approximate index ``kind``) through ``sizes``; measure each size, then close and reopen."""
    dim = 384
    config = IndexConfig(approximate="hnsw" if kind == "hnsw" else "ivf", threads=args.threads)
    out: dict[str, Any] = {"config": config.model_dump(), "sizes": []}
    gen = ClusteredEmbeddings(dim)  # the same vectors for every kind
    buf = ReplayBuffer.open(work / kind, HashingEncoder(dim), config=config)
    try:
        for size in sorted(sizes):
            t_add = 0.0
            added_before, retrains_before = len(buf), buf.index.retrains
            while len(buf) < size:
                n = min(args.batch, size - len(buf))
                records, vectors = make_records(len(buf), n), gen.sample(n)  # built outside the timed add
                t = time.perf_counter()
                buf.add_embedded(records, vectors)
                t_add += time.perf_counter() - t
            row = measure_size(buf, gen, args.queries)
            row["add_per_s"] = (len(buf) - added_before) / t_add
            row["add_rows"] = len(buf) - added_before
            row["ivf_trainings_during_adds"] = buf.index.retrains - retrains_before
            print(json.dumps(row), flush=True)
            out["sizes"].append(row)
        t = time.perf_counter()
        buf.close()
        out["close_snapshot_s"] = time.perf_counter() - t
        t = time.perf_counter()
        buf = ReplayBuffer.open(work / kind, HashingEncoder(dim), config=config)
        out["reopen_s"] = time.perf_counter() - t
        out["disk_bytes"] = buf.stats().disk_bytes
    finally:
        buf.close()
        shutil.rmtree(work / kind)
    return out


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{'rows':>9} {'index':>6} {'recall@8':>8} {'p50 ms':>7} {'p95 ms':>7} {'+records':>8} {'batched':>8} "
          f"{'excl':>6} {'env50%':>7} {'src10%':>7} {'add/s':>8}")
    for kind, run in result["indexes"].items():
        for r in run["sizes"]:
            print(
                f"{r['rows']:>9} {r['index']:>6} {r['recall_at_8']:>8.3f} {r['query_ms']['p50']:>7.3f} "
                f"{r['query_ms']['p95']:>7.3f} {r['query_with_records_ms']['p50']:>8.3f} "
                f"{r['query_batched_per_query_ms']:>8.3f} {r['query_exclude_traj_ms']['p50']:>6.3f} "
                f"{r['query_env_filter_50pct_ms']['p50']:>7.3f} {r['query_source_filter_10pct_ms']['p50']:>7.3f} "
                f"{r['add_per_s']:>8.0f}"
            )
        for r in run["sizes"]:
            for sw in r.get("ef_search_sweep", []) + r.get("nprobe_sweep", []):
                knob = "efSearch" if "ef_search" in sw else "nprobe"
                print(f"  {r['rows']:>9} rows, {knob} {sw.get('ef_search', sw.get('nprobe')):>3}: "
                      f"recall@8 {sw['recall_at_8']:.3f}, cosine gap {sw['cosine_gap']:.4f}, p50 {sw['p50_ms']:.3f} ms")
        print(f"  {kind}: close (snapshot) {run['close_snapshot_s']:.1f} s, reopen {run['reopen_s']:.1f} s, "
              f"disk {run['disk_bytes'] / 2**30:.2f} GiB")
    print(f"peak RSS {result['peak_rss_gib']:.2f} GiB")
    if "encoders" in result:
        e = result["encoders"]
        print(f"MiniLM: {e['minilm_texts_per_s_1_threads']:.0f} texts/s on 1 thread, "
              f"{e['minilm_texts_per_s_2_threads']:.0f} on 2 (load {e['minilm_load_s']:.1f} s); "
              f"hashing: {e['hashing_texts_per_s']:.0f} texts/s; {e['texts']} texts of ~{e['mean_chars']:.0f} chars")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--queries", type=int, default=1_000)
    ap.add_argument("--batch", type=int, default=10_000, help="transitions per add (one committed batch)")
    ap.add_argument("--indexes", choices=["ivf", "hnsw"], nargs="+", default=["ivf", "hnsw"],
                    help="approximate indexes to compare (IndexConfig.approximate), one buffer each")
    ap.add_argument("--hnsw-max-rows", type=int, default=100_000,
                    help="HNSW only up to this size (its adds run at ~1k/s: 1M rows take ~17 min)")
    ap.add_argument("--threads", type=int, default=1, help="faiss OpenMP threads (IndexConfig.threads)")
    ap.add_argument("--encoder-texts", type=int, default=512, help="0 skips the encoder timing")
    ap.add_argument("--workdir", type=Path, default=None, help="where the buffers are built (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_replay.json"))
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_replay_", dir=args.workdir))
    result: dict[str, Any] = {
        "command": shlex.join([sys.executable.split("/")[-1], *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "faiss": faiss.__version__,
                    "loadavg_start": os.getloadavg()},
        "config": {"dim": 384, "k": K, "batch": args.batch},
        "indexes": {},
    }
    try:
        for kind in args.indexes:
            sizes = [s for s in args.sizes if kind != "hnsw" or s <= args.hnsw_max_rows]
            result["indexes"][kind] = bench_index(kind, sizes, args, work)
    finally:
        shutil.rmtree(work)
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if args.encoder_texts:
        result["encoders"] = bench_encoders(args.encoder_texts)
    result["machine"]["loadavg_end"] = os.getloadavg()
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
