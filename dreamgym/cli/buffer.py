"""CLI: ``dreamgym buffer build|query|stats`` for the experience replay buffer."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

buffer_app = typer.Typer(help="Build and query experience replay buffers.", no_args_is_help=True)
console = Console()


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


@buffer_app.command("build")
def build(
    data: list[Path] = typer.Option(..., "--data", help="trajectory file (.jsonl/.parquet); repeat for more"),
    out: Path = typer.Option(..., "--out", help="buffer directory (created, or extended if it exists)"),
    encoder: str | None = typer.Option(
        None, help="minilm | hashing | hashing-<dim> (default: the buffer's, or minilm for a new one)"
    ),
    iteration: int = typer.Option(-1, help="RL iteration that produced the data (-1: offline)"),
    batch: int = typer.Option(256, min=1, help="trajectories per committed batch"),
    threads: int | None = typer.Option(None, help="torch CPU threads for the encoder"),
) -> None:
    """Seed (or extend) a replay buffer with trajectory files; exact duplicates are skipped."""
    from dreamgym.replay import ReplayBuffer, make_encoder
    from dreamgym.types import read_trajectories

    _set_threads(threads)
    # Read and validate every file before adding anything, so a malformed file adds nothing.
    trajs = [t for path in data for t in read_trajectories(path)]
    total = sum(t.num_steps for t in trajs)
    added = 0
    with ReplayBuffer.open(out, make_encoder(encoder) if encoder else None) as buf:
        progress = Progress(
            TextColumn("embedding + adding"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
        )
        with progress:
            task = progress.add_task("add", total=total)
            for start in range(0, len(trajs), batch):
                chunk = trajs[start : start + batch]
                added += buf.add_trajectories(chunk, iteration=iteration)
                progress.advance(task, sum(t.num_steps for t in chunk))
        size = len(buf)
    console.print(
        f"added {added} transitions ({total - added} exact duplicates skipped) from {len(trajs)} trajectories; "
        f"{out} now holds {size}"
    )


@buffer_app.command("query")
def query(
    path: Path = typer.Argument(..., help="buffer directory"),
    state: str = typer.Option(..., help="current state text"),
    action: str = typer.Option(..., help="action taken in it"),
    k: int = typer.Option(8, "-k", "--k", min=1, help="neighbours to return"),
    env: str | None = typer.Option(None, help="only transitions of this env"),
    source: str | None = typer.Option(None, help="only 'real' or 'synthetic' transitions"),
    exclude_traj: str | None = typer.Option(None, help="skip transitions of this trajectory id"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    threads: int | None = typer.Option(None, help="torch CPU threads for the encoder"),
) -> None:
    """Print the k stored transitions most similar to (state, action)."""
    from dreamgym.replay import ReplayBuffer

    _set_threads(threads)
    with ReplayBuffer.open(path, create=False, read_only=True) as buf:
        hits = buf.retrieve(state, action, k, env=env, exclude_traj=exclude_traj, source=source)
    if as_json:
        print(json.dumps([h.model_dump() for h in hits], ensure_ascii=False))
        return
    table = Table("#", "score", "source", "task / step", "action", "reward", "done", "next state (first line)")
    for i, h in enumerate(hits, start=1):
        first = h.next_state.splitlines()[0] if h.next_state else ""
        cells = [str(i), f"{h.score:.3f}", h.source, f"{h.task_id} / {h.step}", h.action, f"{h.reward:g}", str(h.done), first]
        table.add_row(*(Text(c) for c in cells))  # Text: actions like search[...] are not rich markup
    console.print(table)


@buffer_app.command("stats")
def stats(
    path: Path = typer.Argument(..., help="buffer directory"),
    check: bool = typer.Option(False, help="also verify that the index matches the stored vectors"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Counts by env, source and RL iteration; index kind and size."""
    from dreamgym.replay import ReplayBuffer

    with ReplayBuffer.open(path, create=False, read_only=True) as buf:
        if check:
            buf.check()
        s = buf.stats()
    if as_json:
        print(s.model_dump_json())
        return
    for name, value in s.model_dump().items():
        console.print(Text(f"{name:>15}: {value}"))
    if check:
        console.print("check: ok")


def register(app: typer.Typer) -> None:
    app.add_typer(buffer_app, name="buffer")
