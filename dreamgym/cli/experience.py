"""CLI: ``dreamgym annotate`` (reasoning traces for the experience model's training data)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

if TYPE_CHECKING:
    from dreamgym.experience.annotate import FileProgress
    from dreamgym.llm.base import LLMConfig

console = Console(stderr=True)


def load_llm_config(
    path: Path | None, backend: str | None, model: str | None, base_url: str | None, device: str | None
) -> LLMConfig:
    """An :class:`LLMConfig` from a YAML file, with any of the flags overriding its fields."""
    import yaml
    from pydantic import ValidationError

    from dreamgym.llm.base import LLMConfig

    fields: dict[str, object] = {}
    if path is not None:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such LLM config file")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: an LLM config must be a mapping of fields")
        fields.update(loaded)
    overrides = {"backend": backend, "model": model, "base_url": base_url, "device": device}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    if "model" not in fields:
        raise ValueError("--annotator llm needs a teacher: --llm-config FILE or --model NAME")
    try:
        return LLMConfig.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "config"
        raise ValueError(f"LLM config: {where}: {err['msg']}") from None


def annotate(
    data: list[Path] = typer.Option(..., "--data", help="trajectory file (.jsonl/.parquet); repeat for more"),
    out: Path = typer.Option(..., "--out", help="output JSONL (appended; trajectories already in it are skipped)"),
    annotator: str = typer.Option("rule", help="rule (the env's ground-truth explainer) | llm (a teacher model)"),
    llm_config: Path | None = typer.Option(None, "--llm-config", help="teacher LLMConfig as YAML"),
    backend: str | None = typer.Option(None, help="teacher backend: hf | openai (overrides --llm-config)"),
    model: str | None = typer.Option(None, help="teacher model dir / served name (overrides --llm-config)"),
    base_url: str | None = typer.Option(None, help="openai backend URL, e.g. http://127.0.0.1:8000/v1"),
    device: str | None = typer.Option(None, help="hf backend torch device"),
    batch_size: int = typer.Option(16, min=1, help="trajectories per batch (one teacher call; one append)"),
    retries: int = typer.Option(2, min=0, help="llm: new-seed attempts after a malformed answer"),
    max_new_tokens: int = typer.Option(2048, min=1, help="llm: token limit of an answer"),
    temperature: float = typer.Option(0.7, min=0.0, help="llm: sampling temperature"),
    seed: int = typer.Option(0, help="llm: sampling seed"),
    max_state_chars: int = typer.Option(1500, min=1, help="llm: each state in the prompt is cut to this"),
    max_reasoning_chars: int = typer.Option(600, min=1, help="each trace is cut to this many characters"),
    fallback: str = typer.Option("rule", help="llm: traces for unusable answers: rule | empty"),
    threads: int | None = typer.Option(None, help="torch CPU threads (hf backend)"),
    as_json: bool = typer.Option(False, "--json", help="print the run's counts as one JSON object"),
) -> None:
    """Annotate trajectories with reasoning traces (info.reasoning per step, meta.task_tutorial).

    Output is appended one batch at a time (flushed + fsynced); rerunning the same command resumes. Every
    teacher answer that cannot be used after the retries is replaced by the fallback and counted.
    """
    from dreamgym.experience.annotate import (
        Annotator,
        LLMAnnotator,
        RuleAnnotator,
        TeacherConfig,
        annotate_file,
        check_output,
    )

    check_output(data, out)  # before a teacher is loaded
    worker: Annotator
    if annotator == "rule":
        worker = RuleAnnotator(max_reasoning_chars)
    elif annotator == "llm":
        if fallback not in ("rule", "empty"):
            raise ValueError(f"--fallback must be rule or empty, got {fallback!r}")
        cfg = load_llm_config(llm_config, backend, model, base_url, device)
        teacher = TeacherConfig(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            retries=retries,
            seed=seed,
            batch_size=batch_size,
            max_state_chars=max_state_chars,
            max_reasoning_chars=max_reasoning_chars,
            fallback="rule" if fallback == "rule" else "empty",
        )
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        from dreamgym.llm.base import load_llm

        worker = LLMAnnotator(load_llm(cfg), teacher, name=f"llm:{cfg.model}")
    else:
        raise ValueError(f"--annotator must be rule or llm, got {annotator!r}")

    bar = Progress(
        TextColumn(f"[bold]annotate ({annotator})"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("fallbacks {task.fields[fallbacks]}"),
        TimeRemainingColumn(),
        console=console,
    )
    task = bar.add_task("annotate", total=None, fallbacks=0)

    def tick(p: FileProgress) -> None:
        bar.update(task, total=p.total, completed=p.written, fallbacks=p.stats.fallbacks)

    with bar:
        result = annotate_file(data, worker, out, batch_size=batch_size, on_progress=tick)
    summary = {"out": str(out), "written": result.written, "skipped": result.skipped, **result.stats.as_dict()}
    if as_json:
        print(json.dumps(summary))
    else:
        console.print(
            f"wrote {result.written} annotated trajectories to {out} ({result.skipped} already there); "
            f"fallbacks {result.stats.fallbacks}; counts {dict(result.stats.counts)}",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command("annotate")(annotate)
