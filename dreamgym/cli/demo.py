"""CLI: ``dreamgym demo``, the main job on the embedded default, stage by stage, cached in its run directory.

Stages so far: score the scripted policies on the shop's test tasks, then collect the offline real data
(noisy oracle) that the experience model and the SFT warm start learn from. Each stage writes its result
into the run directory; a rerun skips finished stages and resumes an interrupted collection.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()


@dataclass(frozen=True)
class DemoProfile:
    num_products: int
    eval_episodes: int
    offline_episodes: int
    noise: float


PROFILES = {
    "default": DemoProfile(num_products=1000, eval_episodes=200, offline_episodes=3000, noise=0.3),
    "micro": DemoProfile(num_products=200, eval_episodes=30, offline_episodes=60, noise=0.3),
}


def demo(
    out: Path = typer.Option(Path("runs/demo"), help="run directory (stages are cached here)"),
    profile: str = typer.Option("default", help=f"size profile: {' | '.join(PROFILES)}"),
    seed: int = typer.Option(0, help="seed"),
) -> None:
    """Run the DreamGym pipeline on the built-in shop (cached per stage in OUT)."""
    from dreamgym.collect import evaluate, iter_episodes
    from dreamgym.envs import make
    from dreamgym.types import JsonlWriter, read_jsonl

    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    prof = PROFILES[profile]
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps({"profile": profile, "seed": seed, **asdict(prof)}, indent=2))
    env = make("shop", num_products=prof.num_products)

    # Stage 1: scripted policies on held-out test tasks.
    scores_path = out / "scripted_scores.json"
    if scores_path.exists():
        scores = json.loads(scores_path.read_text())
        console.print(f"[dim]stage 1 cached: {scores_path}[/dim]")
    else:
        scores = {}
        for name in ("oracle", "noisy", "random"):
            kwargs = {"noise": prof.noise} if name == "noisy" else {}
            t0 = time.perf_counter()
            with console.status(f"evaluating {name} on {prof.eval_episodes} test episodes"):
                res = evaluate(env, env.scripted_policy(name, seed=seed, **kwargs), prof.eval_episodes, "test", seed)
            scores[name] = {**res.to_dict(), "seconds": round(time.perf_counter() - t0, 2)}
        scores_path.write_text(json.dumps(scores, indent=2))

    # Stage 2: offline real data from the noisy oracle (resumable, one trajectory per line).
    data_path = out / "offline.jsonl"
    have = sum(1 for _ in read_jsonl(data_path)) if data_path.exists() else 0
    if have < prof.offline_episodes:
        policy = env.scripted_policy("noisy", seed=seed, noise=prof.noise)
        from rich.progress import Progress

        with JsonlWriter(data_path) as w, Progress(console=console) as bar:
            task = bar.add_task("collect offline data", total=prof.offline_episodes, completed=have)
            for traj in iter_episodes(env, policy, prof.offline_episodes, split="train", seed=seed, skip=have):
                w.write(traj)
                bar.advance(task)
    else:
        console.print(f"[dim]stage 2 cached: {data_path} ({have} trajectories)[/dim]")
    trajs = list(read_jsonl(data_path))
    env.close()

    table = Table(title=f"dreamgym demo ({profile}) — shop, {prof.num_products} products")
    for col in ("policy", "episodes", "success", "mean reward", "mean steps", "invalid-action rate"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for name, s in scores.items():
        table.add_row(name, str(s["episodes"]), f"{s['success_rate']:.3f}", f"{s['mean_reward']:.3f}",
                      f"{s['mean_steps']:.2f}", f"{s['invalid_action_rate']:.3f}")
    console.print(table)
    n_tr = sum(t.num_steps for t in trajs)
    wins = sum(t.success for t in trajs)
    console.print(f"offline data: {len(trajs)} trajectories, {n_tr} transitions, success {wins / max(len(trajs), 1):.3f} "
                  f"-> {data_path}")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
