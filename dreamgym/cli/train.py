"""CLI: ``dreamgym train`` (GRPO / PPO of an LLM policy in an env, with checkpoints and resume)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console

from dreamgym.cli.env import parse_env_args

console = Console(stderr=True)


def parse_overrides(pairs: list[str] | None) -> dict[str, Any]:
    """``["lr=1e-5", "env_kwargs={num_products: 200}"]`` -> ``{"lr": 1e-05, ...}`` (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def train_cmd(
    out: Path = typer.Option(..., help="run directory (checkpoints, tensorboard, summary.json)"),
    init: str = typer.Option(None, help="policy run dir or HF model dir to start from"),
    env_name: str = typer.Option(None, "--env", help="registered env name (default: the config's, shop)"),
    algo: str = typer.Option(None, help="grpo | ppo (default: the config's, grpo)"),
    config: Path = typer.Option(None, help="YAML file of RLConfig fields"),
    set_: list[str] = typer.Option(None, "--set", help="override an RLConfig field: key=value (repeat)"),
    env_arg: list[str] = typer.Option(None, "--env-arg", help="env constructor argument key=value (repeat)"),
    real_budget: int = typer.Option(None, "--real-budget", min=1,
                                    help="real env transitions the run may use (sim-to-real: e.g. 5000)"),
    s2r_budget: int = typer.Option(None, "--s2r-budget", min=1,
                                   help="after a dream run, continue it in the real env (OUT/s2r) until this many "
                                        "real transitions are used"),
    real_latency: float = typer.Option(None, "--real-latency", help="seconds every real env reset/step of the "
                                       "training rollouts costs (a sleep: a real env's cost; 0: off)"),
    real_sessions: int = typer.Option(None, "--real-sessions", help="real env sessions that may step at once "
                                      "(with --real-latency; default 1)"),
    resume: bool = typer.Option(False, "--resume", help="continue the run in --out from its last checkpoint"),
) -> None:
    """Train an LLM policy with GRPO or PPO; counts every real env transition it consumes.

    Sim-to-real (S2R): ``--s2r-budget N`` on a dream config runs the dream phase into OUT, then the same trainer
    continues from its policy in the real env into OUT/s2r until N real transitions are used (with ``--resume``
    each phase continues from its own checkpoint). The same as a second command with ``--init OUT`` and
    ``--real-budget N``. Precedence: RLConfig defaults < --config (or, with --resume, the run's saved config)
    < --env/--algo/--init/--real-budget/--real-latency/--real-sessions/--env-arg < --set.

    Real-env cost: ``--real-latency S --real-sessions N`` make every reset and step of the real env in training
    rollouts sleep S seconds, at most N at once (a batch of B envs then takes about ceil(B/N)·S); evaluation
    is exempt unless ``--set real_latency_eval=true``, and the dream is never slowed. metrics.jsonl then logs
    the cumulative ``real_wait_s`` (the latency paid, session-seconds), ``real_env_s`` and ``wall_s``.
    """
    from dreamgym.rl.trainer import RLConfig, train
    from dreamgym.types import read_yaml_mapping

    base: dict[str, Any] = {}
    if resume and (out / "config.yaml").is_file():
        base = read_yaml_mapping(out / "config.yaml", "RL config")
    elif config is not None:
        base = read_yaml_mapping(config, "RL config")
    flags = {"env": env_name, "algo": algo, "init": init, "real_transition_budget": real_budget,
             "real_latency_s": real_latency, "real_sessions": real_sessions}
    base.update({k: v for k, v in flags.items() if v is not None})
    if env_arg:
        base["env_kwargs"] = {**base.get("env_kwargs", {}), **parse_env_args(env_arg)}
    base.update(parse_overrides(set_))
    cfg = RLConfig.model_validate(base)
    if s2r_budget is not None and cfg.dream is None:
        raise typer.BadParameter("--s2r-budget continues a dream run in the real env: the config needs `dream`")
    summary = train(cfg, out, resume=resume, console=console)
    keys = ("algo", "iterations", "real_transitions", "eval_transitions", "success_rate", "mean_reward", "eval_episodes")
    main = os.environ.get("RANK", "0") == "0"  # under accelerate launch, rank 0 reports
    if main:
        print(json.dumps({k: summary[k] for k in keys}))
    if s2r_budget is not None:
        s2r_dir = out / "s2r"
        s2r_cfg = cfg.model_copy(update={"dream": None, "init": str(out), "real_transition_budget": s2r_budget})
        started = (s2r_dir / "checkpoint").exists() or (s2r_dir / "checkpoint.old").exists()
        console.rule(f"sim-to-real: {s2r_budget} real transitions")
        s2r = train(s2r_cfg, s2r_dir, resume=resume and started, console=console)
        if main:
            print(json.dumps({"phase": "s2r", **{k: s2r[k] for k in keys}}))


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
