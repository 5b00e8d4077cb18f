"""The run directory: ``config.yaml``, the counters (:class:`TrainState`), atomic checkpoints (weights,
optimizers, critic, RNG states, the task set), the journal of real env steps not yet checkpointed,
``metrics.jsonl`` and ``summary.json``."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from rich.console import Console

from dreamgym.agent.policy import save_policy
from dreamgym.curriculum.taskset import TaskSet
from dreamgym.envs.pool import EnvPool
from dreamgym.rl.config import RLConfig
from dreamgym.rl.critic import check_horizon
from dreamgym.rl.distributed import Dist
from dreamgym.rl.learner import Learner
from dreamgym.software import software

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Counters saved with every checkpoint."""

    iteration: int = 0
    real_transitions: int = 0  # env.step calls in training rollouts: exactly the real data trained on
    synthetic_transitions: int = 0  # dream steps in training rollouts (no real env touched)
    synthetic_tasks: int = 0  # tasks the curriculum added
    eval_transitions: int = 0  # env.step calls in evaluations (never trained on)
    buffer_rows: int | None = None  # the dream's replay buffer size at the checkpoint (later rows: a killed run's)
    hidden_rows: list[list[int]] = field(default_factory=list)  # [start, stop) row ranges of killed runs, hidden
    train_episodes: int = 0
    seconds: float = 0.0  # the run's wall-clock (metrics.jsonl's wall_s), over resumes
    real_wait_s: float = 0.0  # the simulated real-env latency training rollouts paid (session-seconds)
    real_env_s: float = 0.0  # wall-clock training rollouts spent in real env resets/steps (latency included)
    evals: list[dict[str, Any]] = field(default_factory=list)
    world_size: int = 1  # the processes of the attempt that saved it (any world size resumes it)

    def count_rollouts(self, steps: int, episodes: int, source: str, env_s: float, latency_s: float) -> None:
        """Count one iteration's training rollouts: real ones in ``real_transitions``, with the wall-clock of their
        env calls and the simulated latency every reset and step paid (:mod:`dreamgym.envs.latency`); dreamt ones
        in ``synthetic_transitions``."""
        if source == "real":
            self.real_transitions += steps
            self.real_env_s += env_s
            self.real_wait_s += (episodes + steps) * latency_s
        else:
            self.synthetic_transitions += steps
        self.train_episodes += episodes

    def update(self, fields: dict[str, Any]) -> None:
        """Set the given fields (a pool's checkpoint state, :class:`~dreamgym.envs.pool.PoolHooks`)."""
        for key, value in fields.items():
            if key not in self.__dataclass_fields__:
                raise KeyError(f"TrainState has no field {key!r}")
            setattr(self, key, value)


CHECKPOINT, CHECKPOINT_TMP, CHECKPOINT_OLD = "checkpoint", "checkpoint.tmp", "checkpoint.old"
UNCHARGED = "uncharged_real_steps.json"  # real env steps taken since the last checkpoint (see RealStepJournal)


def journal_path(run: Path, rank: int) -> Path:
    """Rank 0's journal is ``UNCHARGED``; rank r > 0 of a data-parallel run keeps ``uncharged_real_steps.rank<r>.json``."""
    return run / (UNCHARGED if rank == 0 else f"uncharged_real_steps.rank{rank}.json")


class RealStepJournal:
    """The real env steps of training rollouts taken after the checkpoint of iteration ``after``, on disk
    before each batched step. A killed attempt loses its uncommitted iterations but not the real interaction
    they used: the next attempt charges those steps to ``real_transitions``, so ``real_transition_budget``
    holds across kills. A kill inside a batched step charges the whole batch (at most ``num_envs`` more than
    were taken, never fewer: a paid budget is not exceeded).
    Tagging the steps with their checkpoint's iteration makes the save-then-reset pair safe: a kill between
    the two leaves a journal older than the checkpoint, which is then ignored (its steps are in it)."""

    def __init__(self, run: Path, rank: int = 0) -> None:
        self.path = journal_path(run, rank)
        self.after, self.steps = 0, 0
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text())
                self.after, self.steps = int(data["after_iteration"]), int(data["steps"])
            except (ValueError, KeyError, TypeError):
                log.warning("%s: unreadable, so its steps cannot be charged", self.path)

    def uncharged(self, checkpoint_iteration: int) -> int:
        """Steps a killed attempt took after the checkpoint now resumed from (0 if the journal is older)."""
        return self.steps if self.after == checkpoint_iteration else 0

    @classmethod
    def open(cls, run: Path, checkpoint_iteration: int, dist: Dist) -> tuple[RealStepJournal, int]:
        """This rank's journal and the steps that every rank of a killed attempt took after the checkpoint (all ranks
        get the total). Journals of ranks past this world size are charged by rank 0, whose journal takes them on
        (their files are removed, so a kill of this attempt charges them once)."""
        journal = cls(run, dist.rank)
        own = journal.uncharged(checkpoint_iteration)
        stale = 0
        if dist.is_main:
            for path in sorted(run.glob("uncharged_real_steps.rank*.json")):
                rank = int(path.name.split(".rank")[1].split(".")[0])
                if rank < dist.world_size:
                    continue
                stale += cls(run, rank).uncharged(checkpoint_iteration)
                path.unlink()
        total = int(sum(dist.gather(own + stale)))  # before any rank writes: journals are written in rollouts only
        journal.after, journal.steps = checkpoint_iteration, own + stale  # what a kill of this attempt must charge too
        return journal, total

    def add(self, n: int) -> None:
        self.steps += n
        self._write()

    def committed(self, iteration: int) -> None:
        self.after, self.steps = iteration, 0
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"after_iteration": self.after, "steps": self.steps}))
        os.replace(tmp, self.path)


TASKS = "tasks.jsonl"  # the task set (the curriculum adds to it), in each checkpoint and beside it


def checkpoint_dir(run: Path) -> Path | None:
    """The newest complete checkpoint of ``run`` (a save killed mid-swap leaves ``checkpoint.old``)."""
    for name in (CHECKPOINT, CHECKPOINT_OLD):
        if (run / name / "state.json").is_file():
            return run / name
    return None


def save_checkpoint(
    run: Path, learner: Learner, rng: np.random.Generator, state: TrainState, taskset: TaskSet | None = None,
) -> None:
    """Write the checkpoint to ``checkpoint.tmp`` and swap it in, so a kill never leaves a torn one."""
    tmp = run / CHECKPOINT_TMP
    shutil.rmtree(tmp, ignore_errors=True)
    policy = learner.policy
    llm: Any = policy.llm
    save_policy(tmp, llm.model, llm.tokenizer, policy.cfg)
    if taskset is not None:
        taskset.save(tmp / TASKS)
    torch.save(learner.optimizer.state_dict(), tmp / "optimizer.pt")
    if learner.critic is not None and learner.critic_optimizer is not None:
        learner.critic.save(tmp / "critic.safetensors")
        torch.save(learner.critic_optimizer.state_dict(), tmp / "critic_optimizer.pt")
    torch.save(torch.get_rng_state(), tmp / "torch_rng.pt")
    rng_states = {"trainer": rng.bit_generator.state, "python": random.getstate(),
                  "numpy": [x.tolist() if isinstance(x, np.ndarray) else x for x in np.random.get_state()]}
    (tmp / "rng.json").write_text(json.dumps(rng_states))
    (tmp / "state.json").write_text(json.dumps(state.__dict__, indent=2))
    current, old = run / CHECKPOINT, run / CHECKPOINT_OLD
    shutil.rmtree(old, ignore_errors=True)
    if current.exists():
        current.rename(old)
    tmp.rename(current)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(ckpt: Path, learner: Learner, rng: np.random.Generator) -> TrainState:
    """Restore optimizer, critic and RNG states (the policy weights are loaded with the policy)."""
    learner.optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
    if learner.critic is not None and learner.critic_optimizer is not None:
        learner.critic.load(ckpt / "critic.safetensors")
        learner.critic_optimizer.load_state_dict(torch.load(ckpt / "critic_optimizer.pt", weights_only=True))
    torch.set_rng_state(torch.load(ckpt / "torch_rng.pt", weights_only=True))
    states = json.loads((ckpt / "rng.json").read_text())
    rng.bit_generator.state = states["trainer"]
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return TrainState(**json.loads((ckpt / "state.json").read_text()))


def resume_pool(pool: EnvPool, state: TrainState) -> None:
    """Hand the checkpoint's state to the pool (the dream hides its replay buffer's rows past the checkpoint)."""
    state.update(pool.load_checkpoint_state(asdict(state)))


def save(run: Path, learner: Learner, rng: np.random.Generator, state: TrainState, taskset: TaskSet,
         pool: EnvPool) -> None:
    """Checkpoint, with the task set and the pool's checkpoint state (the dream: its replay buffer's size)."""
    state.update(pool.checkpoint_state())
    save_checkpoint(run, learner, rng, state, taskset)
    taskset.save(run / TASKS)  # a readable copy of the current task set beside the checkpoint


def open_run(cfg: RLConfig, run: Path, resume: bool, console: Console, main: bool = True) -> tuple[Path | None, str | Path]:
    """Check ``run`` against ``resume`` and write ``RUN/config.yaml`` (``main``: rank 0 of a data-parallel run
    writes); returns the checkpoint to resume from (None for a new run) and the policy to load (that checkpoint's,
    else ``cfg.init``)."""
    ckpt = checkpoint_dir(run) if resume else None
    if resume and ckpt is None:
        raise FileNotFoundError(f"{run}: no checkpoint to resume from")
    if not resume and checkpoint_dir(run) is not None:
        raise ValueError(f"{run}: already holds a run; pass --resume to continue it or choose another --out")
    if cfg.init is None:
        raise ValueError("RLConfig.init: give the policy to start from (a policy run dir or HF model dir)")
    check_horizon(cfg.max_steps, run if ckpt else cfg.init, f"the resumed run {run}" if ckpt else f"the policy {cfg.init}")
    run.mkdir(parents=True, exist_ok=True)
    if main:
        (run / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
        console.print(yaml.safe_dump(cfg.model_dump(), sort_keys=False), highlight=False)
    return ckpt, ckpt if ckpt is not None else cfg.init


def log_metrics(writer: Any, path: Path, metrics: dict[str, Any]) -> None:
    """One iteration's metrics to tensorboard (lists as histograms) and to ``RUN/metrics.jsonl``."""
    it = metrics["iteration"]
    for k, v in metrics.items():
        if isinstance(v, list):
            if v:
                writer.add_histogram(k, np.asarray(v), it)
        elif k != "iteration":
            writer.add_scalar(k, v, it)
    with path.open("a") as f:
        f.write(json.dumps(metrics) + "\n")


def progress_line(m: dict[str, Any]) -> str:
    """One iteration's console line."""
    kl = f"kl {m['kl']:.4f}" if "kl" in m else f"kl(old) {m['approx_kl']:.4f}"  # to the reference, else to π_old
    line = (
        f"iter {m['iteration']:>4} | reward {m['reward']:.3f} | success {m['success']:.2f} | invalid "
        f"{m['invalid_rate']:.2f} | no effect {m.get('no_effect_rate', 0.0):.2f} | {kl} | entropy {m['entropy']:.3f} | "
        f"tok/s {m['tokens_per_s']:.0f} | real {m['real_transitions']} | gen {m['generation_s']:.1f}s env {m['env_s']:.1f}s update {m['update_s']:.1f}s"
    )
    if "sync_s" in m:
        line += f" sync {m['sync_s']:.1f}s (weights v{m['weight_version']})"
    if "eval_success" in m:
        line += f" | [bold]eval success {m['eval_success']:.3f}[/bold]"
    return line


def truncate_metrics(path: Path, iteration: int) -> None:
    """Drop metric lines past the checkpoint a resumed run restarts from."""
    if not path.exists():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["iteration"] <= iteration]
    path.write_text("".join(ln + "\n" for ln in lines))


def write_summary(run: Path, cfg: RLConfig, state: TrainState) -> dict[str, Any]:
    """``RUN/summary.json``: the counters and the last evaluation (and every one, in ``evals``)."""
    last = state.evals[-1] if state.evals else {}
    summary = {
        "algo": cfg.algo, "env": cfg.env, "init": cfg.init,
        "iterations": state.iteration, "real_transitions": state.real_transitions,
        "synthetic_transitions": state.synthetic_transitions, "synthetic_tasks": state.synthetic_tasks,
        "eval_transitions": state.eval_transitions, "train_episodes": state.train_episodes,
        "success_rate": last.get("success_rate"), "mean_reward": last.get("mean_reward"),
        "eval_episodes": last.get("episodes"), "eval_split": cfg.eval_split,
        "initial_eval": state.evals[0] if state.evals and state.evals[0]["iteration"] == 0 else None,
        "evals": state.evals, "seconds": round(state.seconds, 1),
        "wall_s": state.seconds, "real_wait_s": state.real_wait_s, "real_env_s": state.real_env_s,
        "world_size": state.world_size, "software": software(),
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


__all__ = ["RealStepJournal", "TrainState", "checkpoint_dir", "journal_path", "load_checkpoint", "log_metrics", "open_run",
           "progress_line", "resume_pool", "save", "save_checkpoint", "truncate_metrics", "write_summary"]
