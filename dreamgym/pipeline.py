"""The DreamGym pipeline on the built-in shop, stage by stage, each cached in the run directory.

    collect offline data → annotate (rule) → train M_exp → SFT warm start → GRPO-real → DreamGym (dream GRPO)
    → DreamGym-S2R → Table 1 (table.json) + success-vs-real-transitions plot

A stage is done when its output marker exists; rerunning the demo skips it, and an interrupted training stage
resumes from its own checkpoint. Every number in the table is measured here, on the shop's held-out test
tasks, with the real transitions each method consumed (offline data counted apart, as in the paper).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)


class DemoConfig(BaseModel):
    """All the demo's knobs; ``PROFILES`` holds the presets (``--profile``), ``--set`` overrides fields."""

    model_config = ConfigDict(extra="forbid")

    num_products: int = 1000
    seed: int = 0
    offline_episodes: int = 3000
    noise: float = 0.3
    eval_episodes: int = 200
    # experience model
    exp_model: str = "small"
    exp_protocol: dict[str, Any] = Field(default_factory=lambda: {"k": 1, "neighbour_states": False,
                                                                  "system_prompt": "", "history_window": 2})
    exp_sft: dict[str, Any] = Field(default_factory=lambda: {"epochs": 3, "learning_rate": 2e-3, "batch_size": 32,
                                                             "time_budget_s": 900, "num_threads": 2})
    # policy
    policy_model: str = "micro"
    sft: dict[str, Any] = Field(default_factory=lambda: {"epochs": 2, "learning_rate": 3e-3, "batch_size": 32,
                                                         "time_budget_s": 600, "num_threads": 1})
    rl: dict[str, Any] = Field(default_factory=lambda: {"iterations": 10, "tasks_per_iter": 8, "group_size": 8,
                                                        "lr": 5e-5, "eval_every": 5, "num_threads": 2})
    dream: dict[str, Any] = Field(default_factory=lambda: {"task_generator": "rule", "synthetic_share": 0.25})
    dream_iterations: int = 10
    s2r_share: float = Field(default=0.1, gt=0, le=1, description="S2R budget / GRPO-real's real transitions")


PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "micro": {
        "num_products": 100, "offline_episodes": 60, "eval_episodes": 20,
        "exp_model": "micro", "exp_sft": {"epochs": 1, "learning_rate": 3e-3, "batch_size": 16, "num_threads": 2},
        "policy_model": "micro", "sft": {"epochs": 2, "learning_rate": 3e-3, "batch_size": 16, "num_threads": 2},
        "rl": {"iterations": 2, "tasks_per_iter": 2, "group_size": 2, "eval_every": 0, "num_threads": 2,
               "max_steps": 6, "minibatch_size": 32},
        "dream": {"task_generator": "rule", "synthetic_share": 0.5, "max_new_tokens": 48},
        "dream_iterations": 2,
    },
}


def demo_config(profile: str, overrides: dict[str, Any] | None = None) -> DemoConfig:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    return DemoConfig.model_validate({**PROFILES[profile], **(overrides or {})})


def _stage(name: str, marker: Path, run: Callable[[], Any]) -> Any:
    """Run a stage unless its marker (a JSON result file) exists; return the JSON result."""
    if marker.exists():
        console.print(f"[dim]✓ {name} (cached: {marker})[/dim]")
        return json.loads(marker.read_text())
    console.rule(f"[bold]{name}")
    t0 = time.monotonic()
    result = run()
    result = {**result, "stage_seconds": round(time.monotonic() - t0, 1)}
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(result, indent=2))
    return result


def run_demo(cfg: DemoConfig, out: Path) -> list[dict[str, Any]]:
    from dreamgym.agent.policy import PolicyConfig, load_policy
    from dreamgym.baselines.sft import train_bc
    from dreamgym.collect import iter_episodes
    from dreamgym.envs import make
    from dreamgym.eval import evaluate_policy
    from dreamgym.experience.annotate import RuleAnnotator, annotate_file
    from dreamgym.experience.protocol import ProtocolConfig
    from dreamgym.experience.train import train_experience_model
    from dreamgym.rl.envpool import env_factory
    from dreamgym.rl.trainer import RLConfig, train
    from dreamgym.train.sft import SFTConfig
    from dreamgym.types import JsonlWriter, read_jsonl

    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
    env_kwargs = {"num_products": cfg.num_products}
    env = make("shop", **env_kwargs)
    offline = out / "offline.jsonl"
    annotated = out / "offline_annotated.jsonl"

    def collect() -> dict[str, Any]:
        have = sum(1 for _ in read_jsonl(offline)) if offline.exists() else 0
        policy = env.scripted_policy("noisy", seed=cfg.seed, noise=cfg.noise)
        with JsonlWriter(offline) as w:
            for traj in iter_episodes(env, policy, cfg.offline_episodes, "train", cfg.seed, skip=have):
                w.write(traj)
        trajs = list(read_jsonl(offline))
        return {"trajectories": len(trajs), "transitions": sum(t.num_steps for t in trajs),
                "success_rate": sum(t.success for t in trajs) / len(trajs)}

    data = _stage("1/7 collect offline data (noisy oracle)", out / "stages/collect.json", collect)

    def annotate() -> dict[str, Any]:
        progress = annotate_file([offline], RuleAnnotator(), annotated)
        return {"written": progress.written, "skipped": progress.skipped, **progress.stats.as_dict()}

    _stage("2/7 annotate reasoning (rule-based)", out / "stages/annotate.json", annotate)
    exp_dir = out / "experience_model"
    _stage("3/7 train the experience model", out / "stages/train_exp.json", lambda: train_experience_model(
        [annotated], cfg.exp_model, exp_dir, ProtocolConfig(**cfg.exp_protocol), SFTConfig(**cfg.exp_sft),
        buffer_dir=out / "buffer", seed=cfg.seed))

    # Tiny policies answer option numbers (index actions); see dreamgym.agent.policy.
    policy_cfg = PolicyConfig(action_format="index", offer_task_search=True)
    sft_dir = out / "sft"

    def sft() -> dict[str, Any]:
        if not (sft_dir / "summary.json").exists():
            train_bc([offline], cfg.policy_model, sft_dir, SFTConfig(**cfg.sft), policy_cfg)
        t0 = time.monotonic()
        res = evaluate_policy(load_policy(sft_dir), env_factory("shop", **env_kwargs), "test", cfg.eval_episodes,
                              seed=cfg.seed)
        return {"method": "SFT", "real_transitions": 0, **res.to_dict(), "seconds": round(time.monotonic() - t0, 1)}

    rows = [_stage("4/7 SFT warm start (behaviour cloning)", out / "stages/sft.json", sft)]

    def rl_stage(name: str, run_dir: Path, overrides: dict[str, Any]) -> dict[str, Any]:
        rl_cfg = RLConfig.model_validate({**cfg.rl, "env": "shop", "env_kwargs": env_kwargs, "seed": cfg.seed,
                                          "eval_episodes": cfg.eval_episodes, **overrides})
        resume = (run_dir / "checkpoint").exists() or (run_dir / "checkpoint.old").exists()
        s = train(rl_cfg, run_dir, resume=resume, console=console)
        return {"method": name, "real_transitions": s["real_transitions"], "episodes": s["eval_episodes"],
                "success_rate": s["success_rate"], "mean_reward": s["mean_reward"], "seconds": s["seconds"],
                "synthetic_transitions": s.get("synthetic_transitions", 0), "evals": s["evals"]}

    grpo = _stage("5/7 GRPO in the real shop", out / "stages/grpo_real.json",
                  lambda: rl_stage("GRPO (real)", out / "grpo_real", {"init": str(sft_dir)}))
    dream_cfg = {**cfg.dream, "experience_model": str(exp_dir), "buffer": str(out / "buffer"),
                 "offline_data": [str(offline)]}
    dreamgym = _stage("6/7 DreamGym: GRPO in the dream (0 real transitions)", out / "stages/dreamgym.json",
                      lambda: rl_stage("DreamGym", out / "dreamgym",
                                       {"init": str(sft_dir), "dream": dream_cfg, "iterations": cfg.dream_iterations}))
    budget = max(1, int(cfg.s2r_share * max(grpo["real_transitions"], 1)))
    s2r = _stage("7/7 DreamGym-S2R: continue in the real shop", out / "stages/s2r.json",
                 lambda: rl_stage("DreamGym-S2R", out / "s2r",
                                  {"init": str(out / "dreamgym"), "real_transition_budget": budget}))
    rows += [grpo, dreamgym, s2r]
    # seconds: the whole stage (training + evaluation) as first run
    table = [{**{k: r[k] for k in ("method", "real_transitions", "success_rate", "mean_reward")},
              "seconds": r["stage_seconds"]} for r in rows]
    (out / "table.json").write_text(json.dumps({"offline_data": data, "rows": table}, indent=2))
    plot_success_vs_real(rows, out / "success_vs_real.png")
    plot_task_variance(out / "dreamgym" / "metrics.jsonl", out / "curriculum_variance.png")
    print_table(table, data, cfg)
    return table


def plot_success_vs_real(rows: list[dict[str, Any]], path: Path) -> None:
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
    ax.set_ylabel("test success rate (real shop)")
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


def print_table(table: list[dict[str, Any]], data: dict[str, Any], cfg: DemoConfig) -> None:
    t = Table(title=f"DreamGym on the shop ({cfg.num_products} products; offline data: {data['trajectories']} "
                    f"noisy-oracle trajectories, {data['transitions']} transitions)")
    for col in ("method", "real transitions (RL)", "success", "mean reward", "seconds"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for r in table:
        t.add_row(r["method"], str(r["real_transitions"]), f"{r['success_rate']:.3f}", f"{r['mean_reward']:.3f}",
                  f"{r['seconds']:.0f}")
    Console().print(t)
