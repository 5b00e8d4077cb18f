"""The demo's plots (matplotlib, Agg backend): success vs real transitions, and the curriculum's variances."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console(stderr=True)


def plot_success_vs_real(rows: list[dict[str, Any]], path: Path, env: str) -> None:
    """Success in the real env vs real transitions used, per method (evaluations along the way)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        evals = r.get("evals") or [{"real_transitions": r["real_transitions"], "success_rate": r["success_rate"]}]
        xs = [e["real_transitions"] for e in evals]
        ys = [e["success_rate"] for e in evals]
        ax.plot(xs, ys, marker="o", label=r["method"])
    ax.set_xlabel("real transitions used in RL (offline data excluded)")
    ax.set_ylabel(f"test success rate (real {env})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_task_variance(metrics_path: Path, path: Path) -> None:
    """The curriculum's group reward variance V = mean((r - mean r)^2) per iteration: one histogram column per
    iteration (V of a reward in [0, 1] is at most 0.25), plus the share of groups with V > 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "task_variances" in r]
    if not rows:
        console.print(f"[yellow]no task variances in {metrics_path}: curriculum plot skipped[/yellow]")
        return
    bins = np.linspace(0.0, 0.25, 11)
    counts = np.stack([np.histogram(np.clip(r["task_variances"], 0, 0.25), bins=bins)[0] for r in rows], axis=1)
    iterations = [r["iteration"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 5), sharex=True, height_ratios=[3, 1])
    image = top.imshow(counts, origin="lower", aspect="auto", cmap="viridis",
                       extent=(iterations[0] - 0.5, iterations[-1] + 0.5, 0.0, 0.25))
    fig.colorbar(image, ax=top, label="groups")
    top.set_ylabel("group reward variance V")
    bottom.plot(iterations, [float(np.mean(np.asarray(r["task_variances"]) > 0)) for r in rows], marker="o")
    bottom.set_ylabel("share V > 0")
    bottom.set_xlabel("iteration (DreamGym run)")
    bottom.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
