"""CLI: ``dreamgym model init`` (a tiny tokenizer + model for the CPU default) and ``dreamgym serve``."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console

model_app = typer.Typer(help="Create local models.", no_args_is_help=True)
console = Console()


@model_app.command("init")
def init(
    preset: str = typer.Option("micro", help="micro (~0.2M params, tests) | small (~3.7M, demo) | base (~21M)"),
    corpus: list[Path] = typer.Option(..., "--corpus", help="text or trajectory (.jsonl/.parquet) file; repeat"),
    out: Path = typer.Option(..., help="output model directory (must be empty or absent)"),
    vocab_size: int | None = typer.Option(None, help="BPE vocabulary size (default: the preset's)"),
    seed: int = typer.Option(0, help="weight initialisation seed"),
) -> None:
    """Train a byte-level BPE tokenizer on the corpus and save a freshly initialised tiny Llama with it."""
    from transformers.utils import logging as hf_logging

    from dreamgym.llm.tiny import init_tiny_model

    hf_logging.disable_progress_bar()
    model = init_tiny_model(preset, corpus, out, vocab_size=vocab_size, seed=seed)
    n_params = sum(p.numel() for p in model.parameters())
    console.print(f"saved {preset} model ({n_params / 1e6:.2f}M params, vocab {model.config.vocab_size}) to {out}")


def serve_command(
    model_dir: str = typer.Argument(..., help="a Hugging Face model directory (or hub name)"),
    port: int = typer.Option(8000, help="port"),
    host: str = typer.Option("127.0.0.1", help="bind address (loopback by default)"),
    api_key_env: str | None = typer.Option(None, help="env var holding the API key clients must send (Bearer)"),
    max_batch: int = typer.Option(64, help="rows in the running batch (and the most one request may have)"),
    max_tokens: int = typer.Option(1024, help="cap on a request's max_tokens"),
    served_model_name: str | None = typer.Option(None, help="model id clients send (default: MODEL_DIR as given)"),
    device: str = typer.Option("cpu", help="torch device"),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
    threads: int | None = typer.Option(None, help="torch CPU threads (1 is fastest for tiny models on a busy CPU)"),
) -> None:
    """Serve a local model with an OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions)."""
    import torch
    from transformers.utils import logging as hf_logging

    from dreamgym.llm.serve import ServerLimits, serve

    hf_logging.disable_progress_bar()
    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ValueError(f"--api-key-env {api_key_env}: the environment variable is unset or empty")
    if threads is not None:
        torch.set_num_threads(threads)
    limits = ServerLimits(max_batch=max_batch, max_tokens=max_tokens)
    serve(model_dir, host, port, api_key, served_model_name, limits, device=device, dtype=dtype)


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
    app.command("serve")(serve_command)
