"""CLI: ``dreamgym model init`` (a tiny tokenizer + model for the CPU default) and ``dreamgym serve``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

model_app = typer.Typer(help="Create local models.", no_args_is_help=True)
console = Console()


@model_app.command("init")
def init(
    preset: str = typer.Option("micro", help="pretrained (the shipped base, ~1.3M) | pretrained-policy (the shipped "
                               "policy's base, ~1.3M) | micro (~0.2M params, tests) | small (~3.7M) | base (~21M)"),
    corpus: list[Path] = typer.Option([], "--corpus", help="text or trajectory (.jsonl/.parquet) file; repeat "
                                      "(not with pretrained)"),
    out: Path = typer.Option(..., help="output model directory (must be empty or absent)"),
    vocab_size: int | None = typer.Option(None, help="BPE vocabulary size (default: the preset's)"),
    seed: int = typer.Option(0, help="weight initialisation seed"),
) -> None:
    """Save a model to start from: a copy of the shipped pre-trained base (``--preset pretrained``), or a freshly
    initialised tiny Llama with a byte-level BPE tokenizer trained on the corpus."""
    from transformers.utils import logging as hf_logging

    from dreamgym.llm.pretrained import BASES, copy_base
    from dreamgym.llm.tiny import init_tiny_model

    if preset in BASES:
        copied = copy_base(out, preset)
        console.print(f"copied the pre-trained base {preset} ({copied['params'] / 1e6:.2f}M params, "
                      f"{copied['tokens_seen']:,} tokens seen) to {out}")
        return
    hf_logging.disable_progress_bar()
    model = init_tiny_model(preset, corpus, out, vocab_size=vocab_size, seed=seed)
    n_params = sum(p.numel() for p in model.parameters())
    console.print(f"saved {preset} model ({n_params / 1e6:.2f}M params, vocab {model.config.vocab_size}) to {out}")


@model_app.command("pretrain")
def pretrain(
    out: Path = typer.Option(..., help="output directory (a rerun of the same command resumes in it)"),
    preset: str = typer.Option("128x4", help="tiny shape: micro | small | base | <hidden>x<layers>"),
    tokens: int = typer.Option(20_000_000, min=1, help="corpus tokens to train on (prompt + target)"),
    seed: int = typer.Option(0, help="corpus, tokenizer and initialisation seed"),
    vocab_size: int = typer.Option(2048, help="BPE vocabulary size"),
    learning_rate: float = typer.Option(2e-3, help="peak learning rate (cosine, 100 warmup steps)"),
    batch_size: int = typer.Option(16, min=1, help="examples per step"),
    time_cap: float | None = typer.Option(None, help="safety limit in seconds; the manifest records if it fired"),
    threads: int | None = typer.Option(None, help="torch CPU threads"),
    init: str | None = typer.Option(None, help="continue this base (pretrained or a base directory) instead of "
                                    "a fresh initialisation; its shape and tokenizer are kept"),
    corpus_version: str = typer.Option("1", help="corpus recipe (dreamgym.pretrain.corpus.RECIPES): 1 (the "
                                       "shipped base's), 2 (a recurring site pool), 3 (2 + a made-up lexicon), "
                                       "4 (compact sites + echo), 5 (4 + the option match, agent examples answered "
                                       "by their words), 6 (5 + finished item pages: buy), 7 (6 with M_exp examples in the "
                                       "shop default's protocol: copy references, exact neighbours, typed purchases)"),
    group_by_length: bool = typer.Option(False, help="batch examples of similar length (less padding, faster)"),
    induction_steps: int = typer.Option(0, min=0, help="steps of the procedural copy warm-up (random tokens shown "
                                        "twice) before the corpus, on a fresh model"),
    copy_steps: int = typer.Option(0, min=0, help="steps of the copy warm-up (the corpus's echo examples only: copy "
                                   "a page unchanged) before the mixture"),
    match_steps: int = typer.Option(0, min=0, help="steps of the match warm-up after the copy warm-up (the corpus's "
                                    "match examples only: click the option the task names) before the mixture"),
    max_length: int = typer.Option(768, min=16, help="tokens an example is cut to (from the left of its prompt)"),
    tokenizer_style: str = typer.Option("bytes", help="bytes (GPT-2 byte-level BPE, the shipped base's) or words "
                                        "(a word is the same tokens wherever it stands: dreamgym.llm.tiny.WORD_SPLIT)"),
) -> None:
    """Pre-train a tiny base model on the procedural copy-and-compare corpus (dreamgym.pretrain.corpus)."""
    import shlex
    import sys

    from transformers.utils import logging as hf_logging

    from dreamgym.pretrain.train import pretrain_base

    hf_logging.set_verbosity_error()
    command = "dreamgym " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    manifest = pretrain_base(out, preset, tokens, seed, vocab_size, learning_rate, batch_size, max_length=max_length,
                             time_cap_s=time_cap, num_threads=threads, command=command, init=init,
                             corpus_version=corpus_version, group_by_length=group_by_length,
                             induction_steps=induction_steps, tokenizer_style=tokenizer_style,
                             copy_steps=copy_steps, match_steps=match_steps)
    console.print(f"pre-trained {preset} ({manifest['params'] / 1e6:.2f}M params) on {manifest['tokens_seen']:,} "
                  f"tokens in {manifest['train_seconds']:.0f} s, loss {manifest['train_loss']:.3f}: {out}")


@model_app.command("pack")
def pack(
    src: str = typer.Argument(..., help="a base directory (dreamgym model pretrain's --out) or a shipped base's name"),
    out: Path = typer.Option(..., help="output directory (must be empty or absent)"),
    dtype: str = typer.Option("float16", help="float16 | bfloat16: how the weights are stored (loaded as float32)"),
) -> None:
    """Pack a base for shipping: its inference files only, the weights stored at half precision (half the bytes),
    and a manifest with the new sha256 of every file, the rounding error and this command."""
    import shlex
    import sys

    from dreamgym.llm.pretrained import pack_base

    command = "dreamgym " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    manifest = pack_base(src, out, dtype, command=command)
    size = sum((out / n).stat().st_size for n in manifest["files"])
    console.print(f"packed {src} as {dtype} ({size / 2**20:.2f} MiB, largest relative rounding error "
                  f"{manifest['packed']['max_relative_error']:.1e}): {out}")


@model_app.command("probe")
def probe(
    model: str = typer.Argument("pretrained", help="'pretrained', a base directory or a training checkpoint"),
    tokenizer: str | None = typer.Option(None, help="tokenizer directory (default: the model's own; a training "
                                         "checkpoint has none: give its run's output directory)"),
    per_skill: int = typer.Option(16, min=1, help="held-out examples per skill"),
    threads: int = typer.Option(1, min=1, help="torch CPU threads"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Copy probe: teacher-forced target-token accuracy per corpus skill on held-out fresh-site examples, and the
    answer probe: the share of buy scores and chosen options predicted whole, beside the majority answer's.

    The shipped base, which copies nothing yet, scores 0.45-0.65 on the copy skills (open, select, invalid);
    a perfect copier scores 1.0."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from dreamgym.llm.pretrained import resolve_model
    from dreamgym.pretrain.train import answer_probe, copy_probe

    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    path = resolve_model(model)
    for need in (Path(path) / "config.json", Path(tokenizer or path) / "tokenizer.json"):
        if not need.is_file():
            raise ValueError(f"{need}: missing (is {model} a model directory?)")
    lm, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(tokenizer or path)
    got: dict[str, Any] = copy_probe(lm, tok, per_skill=per_skill)
    answers = answer_probe(lm, tok, per_skill=4 * per_skill)
    if as_json:
        print(json.dumps({**got, "answers": answers}))
    else:
        for skill, acc in got.items():
            console.print(f"{skill}: {acc:.3f}", highlight=False)
        for skill, a in answers.items():
            console.print(f"{skill} answer: {a['accuracy']:.3f} (majority answer {a['majority']:.3f})", highlight=False)


@model_app.command("info")
def info(
    name: str = typer.Argument("pretrained", help="'pretrained' or 'pretrained-policy' (the shipped bases) or a base "
                               "directory"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Path, parameters, bytes, sha256 and tokens seen of a pre-trained base (checked against its manifest)."""
    import json

    from dreamgym.llm.pretrained import base_info

    got = base_info(name)
    if as_json:
        print(json.dumps(got))
    else:
        for key, value in got.items():
            console.print(f"{key}: {value}", highlight=False)


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
