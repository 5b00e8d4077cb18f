"""Generation throughput of the tiny presets: the ``hf`` backend at several batch sizes (and against
``model.generate``), and ``dreamgym serve`` with concurrent clients against the in-process backend.

    .venv/bin/python benchmarks/bench_llm.py [--presets micro small] [--repeats 3]

Every number is generated tokens per second (greedy, ``--new-tokens`` per prompt), the median of
``--repeats`` runs; the runs being compared alternate within one process so machine load hits both alike.
Prints a table and writes ``benchmarks/results/bench_llm.json`` with the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
import torch
from transformers.utils import logging as hf_logging

from dreamgym.llm import Completion, LLMConfig, SamplingParams
from dreamgym.llm.hf import HFLLM
from dreamgym.llm.openai_backend import OpenAILLM
from dreamgym.llm.tiny import init_tiny_model

SYLLABLES = ["ka", "lo", "mi", "ne", "shi", "ta", "ru", "po", "ve", "da", "xi", "bo", "qua", "zen", "fi", "gu"]


def shop_like_text(rng: random.Random, n_words: int) -> str:
    """Element-listing-like text over a few thousand made-up words, so the BPE vocabulary fills up."""
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(n_words)]
    return " ".join(f"\n[{rng.randint(1, 99)}] button: {w}" if rng.random() < 0.2 else w for w in words)


def tokens_per_s(run: Callable[[], list[Completion]]) -> float:
    t0 = time.perf_counter()
    done = run()
    return sum(len(c.token_ids) for c in done) / (time.perf_counter() - t0)


def median_interleaved(runs: dict[str, Callable[[], list[Completion]]], repeats: int) -> dict[str, float]:
    """Median tokens/s of each run; the runs alternate so that a load spike hits all of them."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            samples[name].append(tokens_per_s(run))
    return {name: round(statistics.median(s), 1) for name, s in samples.items()}


def start_server(model_dir: Path, port: int, threads: int, max_batch: int) -> subprocess.Popen[bytes]:
    return start_serve(["--threads", str(threads), "--max-batch", str(max_batch), "--served-model-name", "bench"],
                       model_dir, port)


def start_serve(args: list[str], model_dir: Path, port: int, api_key: str | None = None) -> subprocess.Popen[bytes]:
    """``dreamgym serve MODEL_DIR --port PORT ARGS`` in its own process, returned once ``/v1/models`` answers
    (with ``api_key`` as its Bearer key); its stderr tail in the error if it exits or is not up within 120 s."""
    cmd = [sys.executable, "-m", "dreamgym", "serve", str(model_dir), "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=headers, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError(f"dreamgym serve exited: {proc.stderr.read().decode()[-500:] if proc.stderr else ''}")
    proc.kill()
    raise RuntimeError("dreamgym serve did not start within 120 s")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_preset(preset: str, corpus: Path, workdir: Path, args: argparse.Namespace) -> dict[str, object]:
    model_dir = workdir / preset
    model = init_tiny_model(preset, [corpus], model_dir, seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    rng = random.Random(1)
    prompts = [shop_like_text(rng, rng.randint(10, 40)) for _ in range(max(args.batches) * 2)]
    greedy = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
    llm = HFLLM.from_pretrained(model_dir)
    llm.generate(prompts[:2], greedy)  # warm-up

    # hf backend at each batch size: batch 1 runs few prompts one by one (it is slow), the others 2 batches
    runs: dict[str, Callable[[], list[Completion]]] = {}
    for b in args.batches:
        batch_llm = HFLLM(llm.model, llm.tokenizer, max_batch_size=b)
        subset = prompts[: 4 if b == 1 else 2 * b]
        runs[f"hf_batch_{b}"] = partial(batch_llm.generate, subset, greedy)

    # our decode loop vs transformers' generate on the same batch (fixed length: min_new_tokens = max)
    ref = prompts[: args.clients]
    enc = llm.tokenizer(ref, return_tensors="pt", padding=True)

    def hf_generate() -> list[Completion]:
        out = llm.model.generate(**enc, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
        return [Completion(text="", token_ids=row[enc.input_ids.shape[1] :].tolist()) for row in out]

    runs[f"own_loop_batch_{args.clients}"] = partial(HFLLM(llm.model, llm.tokenizer, args.clients).generate, ref, greedy)
    runs[f"model_generate_batch_{args.clients}"] = hf_generate

    # the server with `clients` concurrent clients vs the in-process backend, same prompts and batch cap
    served_prompts = prompts[: args.clients * args.server_rounds]
    port = free_port()
    server = start_server(model_dir, port, args.threads, max_batch=args.clients)
    remote = OpenAILLM(LLMConfig(backend="openai", model="bench", base_url=f"http://127.0.0.1:{port}/v1", concurrency=args.clients))
    local = HFLLM(llm.model, llm.tokenizer, max_batch_size=args.clients)
    try:
        remote.generate(served_prompts[:4], greedy)  # warm-up
        runs["in_process"] = lambda: local.generate(served_prompts, greedy)
        runs["served"] = lambda: remote.generate(served_prompts, greedy)
        result = median_interleaved(runs, args.repeats)
        stats = httpx.get(f"http://127.0.0.1:{port}/stats", timeout=10).json()
    finally:
        remote.close()
        server.terminate()
        server.wait(timeout=30)
    return {
        "params_m": round(n_params / 1e6, 3),
        "vocab": len(llm.tokenizer),
        "tokens_per_s": result,
        "own_loop_over_model_generate": round(result[f"own_loop_batch_{args.clients}"] / result[f"model_generate_batch_{args.clients}"], 2),
        "served_over_in_process": round(result["served"] / result["in_process"], 3),
        "server_stats": stats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["micro", "small"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32, 64])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients of the server")
    parser.add_argument("--server-rounds", type=int, default=4, help="prompts per client in a served run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (in-process and server); 2 collapses under load")
    parser.add_argument("--out", default="benchmarks/results/bench_llm.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    load_at_start = os.getloadavg()[0]
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        rng = random.Random(0)
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(shop_like_text(rng, 30) for _ in range(3000)), encoding="utf-8")
        for preset in args.presets:
            results[preset] = bench_preset(preset, corpus, Path(tmp), args)
            print(f"{preset}: {json.dumps(results[preset])}", flush=True)

    print(f"\n{'preset':<8}{'run':<28}{'tokens/s':>12}")
    for preset, r in results.items():
        assert isinstance(r, dict)
        for name, value in r["tokens_per_s"].items():
            print(f"{preset:<8}{name:<28}{value:>12.1f}")
        print(f"{preset:<8}{'served / in-process':<28}{r['served_over_in_process']:>12.3f}")
        print(f"{preset:<8}{'own loop / model.generate':<28}{r['own_loop_over_model_generate']:>12.2f}")
    record = {
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "config": vars(args),
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_start": load_at_start, "torch": torch.__version__},
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
