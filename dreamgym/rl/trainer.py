"""The RL trainer: GRPO or PPO on multi-turn rollouts in any env (the real shop, an AgentGym server, the dream).

One loop, read top to bottom (CleanRL style). Each iteration:

1. sample ``tasks_per_iter`` tasks of the train split and play ``group_size`` episodes of each
   (:func:`~dreamgym.rl.rollout.collect_rollouts`); every ``env.step`` is counted in ``real_transitions``;
2. advantages, one per turn: GRPO = the episode's group-normalised return on every turn of the episode;
   PPO = turn-level GAE(γ, λ) with the critic's V(s_t) (:mod:`dreamgym.rl.advantages`);
3. ``ppo_epochs`` passes over shuffled minibatches of turns (one row = one turn's prompt + response, loss
   mask on the response only): log-probs recomputed with ``sequence_logprobs``, clipped policy loss, k3 KL to
   the frozen initial policy (only when ``kl_coef > 0``), optional entropy bonus; PPO also fits the critic
   with the clipped value loss; AdamW with gradient clipping;
4. log (tensorboard in ``RUN/tb``, ``RUN/metrics.jsonl``, one console line), evaluate greedily on the eval
   split every ``eval_every`` iterations (those episodes are counted apart and never trained on), and
   checkpoint every ``save_every`` iterations (weights, optimizer, critic, RNG states, counters; atomic).

``RUN/summary.json`` holds ``real_transitions``, ``iterations`` and the last evaluation. The env is made by
:func:`make_env_factory` only, so sim-to-real is this trainer with a real env and a ``real_transition_budget``.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from torch import Tensor, nn

from dreamgym.agent.policy import LLMPolicy, load_policy, on_policy_config, save_policy
from dreamgym.collect import EvalResult, summarize
from dreamgym.curriculum import TaskGenerator, TaskSet, cluster_groups, variation_operator
from dreamgym.eval import run_eval_episodes
from dreamgym.experience.dream import DreamConfig, DreamEnvPool, open_dream
from dreamgym.rl.advantages import episode_gae, group_advantages, reward_variance
from dreamgym.rl.critic import Critic, check_horizon, truncated_values
from dreamgym.rl.envpool import EnvFactory, EnvPool, env_factory, make_pool
from dreamgym.rl.losses import (
    AggMode,
    KLKind,
    agg_loss,
    check_kl_loss,
    dropout_off,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    masked_whiten,
    policy_loss,
    sequence_logprobs,
    value_loss,
)
from dreamgym.rl.rollout import MAX_SEED, Episode, RolloutStats, collect_rollouts, count_env_steps
from dreamgym.types import write_jsonl

log = logging.getLogger(__name__)


class RLConfig(BaseModel):
    """Everything a run needs; saved as ``RUN/config.yaml``. Defaults suit the CPU tiny policy."""

    model_config = ConfigDict(extra="forbid")

    algo: Literal["grpo", "ppo"] = "grpo"
    init: str | None = Field(default=None, description="policy run dir or HF model dir to start from")
    env: str = "shop"
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    env_backend: Literal["local", "ray"] = "local"
    train_split: str = "train"
    eval_split: str = "test"
    # rollouts
    iterations: int = Field(default=20, ge=1)
    tasks_per_iter: int = Field(default=8, ge=1, description="16 in the paper")
    group_size: int = Field(default=8, ge=1)
    max_steps: int = Field(default=15, ge=1)
    temperature: float = Field(default=1.0, gt=0, description="sampling temperature (log-probs use it too)")
    invalid_action_penalty: float = Field(default=0.1, ge=0)
    real_transition_budget: int | None = Field(
        default=None, ge=1, description="stop once this many are used; the last iterations shrink to fit it")
    strict_budget: bool = Field(default=False, description="never exceed real_transition_budget: stop when not "
                                "even one group of episodes is certain to fit (else one more group runs)")
    # optimisation
    lr: float = Field(default=5e-5, gt=0, description="the paper's 1e-6 is for 3B–8B models")
    critic_lr: float = Field(default=1e-4, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    ppo_epochs: int = Field(default=1, ge=1)
    minibatch_size: int = Field(default=128, ge=1, description="turns per optimizer step")
    micro_batch_size: int = Field(default=32, ge=1, description="turns per forward pass (gradient accumulation)")
    clip_eps: float = Field(default=0.2, gt=0)
    clip_eps_high: float | None = Field(default=None, gt=0)
    loss_agg: AggMode = "token-mean"
    kl_coef: float = Field(default=0.0, ge=0, description="0.02 in the paper; 0 skips the reference model")
    kl_estimator: KLKind = "k3"
    entropy_coef: float = Field(default=0.0, ge=0)
    normalize_std: bool = Field(default=True, description="GRPO; False = Dr.GRPO")
    turn_weighting: Literal["token", "episode"] = Field(
        default="token", description="GRPO: 'episode' scales each turn's advantage by mean_turns/turns, so a long "
        "failed episode does not outweigh a short success (benchmarks/results/shop_rl.json, notes)")
    gamma: float = Field(default=0.99, ge=0, le=1, description="PPO")
    lam: float = Field(default=0.95, ge=0, le=1, description="PPO")
    vf_clip: float | None = Field(default=0.2, gt=0, description="PPO")
    normalize_advantages: bool = Field(default=True, description="PPO: whiten advantages over the batch")
    # evaluation, logging, checkpoints
    eval_every: int = Field(default=5, ge=0, description="0: only at the start and the end")
    eval_episodes: int = Field(default=100, ge=0)
    eval_at_start: bool = True
    save_every: int = Field(default=5, ge=1)
    save_rollouts: bool = Field(default=True, description="write each iteration's episodes to RUN/rollouts/")
    seed: int = 0
    num_threads: int | None = Field(default=2, ge=1)
    # DreamGym: roll out in the experience model's dream instead of the real env (None: the real env)
    dream: DreamConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> RLConfig:
        if self.algo == "grpo" and self.group_size < 2:
            raise ValueError("GRPO needs group_size >= 2 (a group of one has no baseline)")
        return self

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> RLConfig:
        from dreamgym.types import read_yaml_mapping

        return cls.model_validate({**read_yaml_mapping(path, "RL config"), **(overrides or {})})

    # RL details (issue 14): on-policy sampling, truncation bootstrap, dual-clip
    top_p: float = Field(default=1.0, gt=0, le=1, description="on-policy sampling: only 1.0 (a loaded policy's "
                         "saved top_p is overridden, with a warning)")
    top_k: int | None = Field(default=None, ge=0, description="on-policy sampling: only None or 0 (off)")
    bootstrap_truncated: bool = Field(
        default=False, description="PPO: bootstrap an episode cut by max_steps with the critic's V(s_T) instead of "
        "V_T = 0. Off by default: the prompt shows the step number and a run has one max_steps, so the limit is "
        "part of the state and the cut is terminal; on when the horizon is not (e.g. it differs between phases)")
    clip_ratio_c: float | None = Field(default=None, gt=1, description="dual-clip PPO: cap the loss of A < 0 "
                                       "tokens at -c*A (verl uses 3.0); None: off")

    @model_validator(mode="after")
    def _check_rl_details(self) -> RLConfig:
        if self.top_p != 1.0 or self.top_k not in (None, 0):
            raise ValueError(
                f"top_p={self.top_p:g}, top_k={self.top_k}: on-policy RL samples with top_p=1.0 and no top_k, because "
                "the loss scores each token under the full softmax; truncated sampling would bias the policy gradient")
        check_kl_loss(self.kl_estimator)
        return self


def make_env_factory(cfg: RLConfig) -> EnvFactory:
    """The one place the trainer creates envs."""
    return env_factory(cfg.env, **cfg.env_kwargs)


# ----------------------------------------------------------------------------------------- turn batches


@dataclass
class TurnRow:
    """One turn as a training row: prompt (context) + response (trained), with its targets."""

    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantage: float = 0.0
    ret: float = 0.0  # PPO: the critic's regression target (λ-return)
    old_value: float = 0.0  # PPO: V(s_t) at rollout time


def turn_rows(episodes: Sequence[Episode]) -> list[TurnRow]:
    rows = []
    for e in episodes:
        for t in e.turns:
            if t.logprobs is None:
                raise ValueError("training needs sampled rollouts with log-probs (greedy=False)")
            rows.append(TurnRow(t.prompt_ids, t.response_ids, t.logprobs))
    return rows


def collate(rows: Sequence[TurnRow], pad_id: int, with_response: bool = True) -> dict[str, Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` [B, L]; ``mask`` is 1 on response tokens only, and
    ``old_logp`` holds the behaviour log-probs at those positions (aligned with the token they score)."""
    seqs = [r.prompt_ids + r.response_ids if with_response else r.prompt_ids for r in rows]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width))
    old_logp = torch.zeros((len(rows), width))
    for i, (r, s) in enumerate(zip(rows, seqs, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        if with_response:
            start, end = len(r.prompt_ids), len(s)
            mask[i, start:end] = 1.0
            old_logp[i, start:end] = torch.tensor(r.old_logprobs)
    return {"input_ids": ids, "attention_mask": attn, "mask": mask, "old_logp": old_logp}


# ----------------------------------------------------------------------------------------- advantages


def grpo_advantages(
    episodes: Sequence[Episode], rows: list[TurnRow], normalize_std: bool, turn_weighting: str = "token"
) -> None:
    """GRPO: every turn of an episode gets its episode's group-normalised (shaped) return; with
    ``turn_weighting="episode"`` scaled by mean_turns / turns, so every episode weighs the same in the loss."""
    returns = torch.tensor([e.shaped_return for e in episodes], dtype=torch.float64)
    advantages = group_advantages(returns, [e.group_id for e in episodes], normalize_std=normalize_std)
    mean_turns = sum(len(e.turns) for e in episodes) / max(len(episodes), 1)
    scale = [mean_turns / max(len(e.turns), 1) if turn_weighting == "episode" else 1.0 for e in episodes]
    turn_adv = [float(a) * w for e, a, w in zip(episodes, advantages, scale, strict=True) for _ in e.turns]
    for row, a in zip(rows, turn_adv, strict=True):
        row.advantage = a


@torch.no_grad()
def critic_values(critic: Critic, rows: Sequence[TurnRow], pad_id: int, micro_batch_size: int) -> list[float]:
    values: list[float] = []
    for start in range(0, len(rows), micro_batch_size):
        batch = collate(rows[start : start + micro_batch_size], pad_id, with_response=False)
        values.extend(critic(batch["input_ids"], batch["attention_mask"]).tolist())
    return values


def ppo_advantages(
    episodes: Sequence[Episode], rows: list[TurnRow], cfg: RLConfig, last_values: Sequence[float | None] | None = None
) -> None:
    """PPO: turn-level GAE per episode. The prompt shows the step number, so the step limit is part of the
    state and a truncated episode's last turn is terminal like any other (no bootstrap past it), unless
    ``last_values`` gives V(s_T) of the cut episodes (``cfg.bootstrap_truncated``; see ``episode_gae``)."""
    i = 0
    for j, e in enumerate(episodes):
        n = len(e.turns)
        advantages, returns = episode_gae([t.reward for t in e.turns], [r.old_value for r in rows[i : i + n]],
                                          cfg.gamma, cfg.lam, None if last_values is None else last_values[j])
        for row, a, r in zip(rows[i : i + n], advantages, returns, strict=True):
            row.advantage, row.ret = a, r
        i += n
    if cfg.normalize_advantages and len(rows) > 1:
        adv = torch.tensor([r.advantage for r in rows])
        for row, a in zip(rows, masked_whiten(adv, torch.ones_like(adv)).tolist(), strict=True):
            row.advantage = a


# ----------------------------------------------------------------------------------------- the update


class _KeepLogits(nn.Module):
    """Calls the model and keeps its logits, so ``sequence_logprobs`` and the entropy share one forward."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.logits: Tensor | None = None

    def forward(self, **kwargs: Any) -> Any:
        out = self.model(**kwargs)
        self.logits = out.logits
        return out


def _weight(batch: dict[str, Tensor], minibatch_tokens: float, minibatch_rows: int, agg: AggMode) -> float:
    """Share of a minibatch's loss that a micro-batch carries (token-mean weighs tokens, the rest rows)."""
    if agg == "token-mean":
        return float(batch["mask"].sum()) / minibatch_tokens
    return batch["mask"].shape[0] / minibatch_rows


def update(
    model: nn.Module,
    ref_model: nn.Module | None,
    critic: Critic | None,
    optimizer: torch.optim.Optimizer,
    critic_optimizer: torch.optim.Optimizer | None,
    rows: list[TurnRow],
    cfg: RLConfig,
    pad_id: int,
    max_new_tokens: int,
    rng: np.random.Generator,
) -> dict[str, float]:
    """``ppo_epochs`` passes of minibatch updates over ``rows``; returns the mean of each logged quantity."""
    log: dict[str, list[float]] = {}
    keeper = _KeepLogits(model)
    restore_modes = dropout_off(model, critic)  # old and new log-probs (and values) without dropout: ratio 1 at first
    for _ in range(cfg.ppo_epochs):
        order = rng.permutation(len(rows))
        for start in range(0, len(rows), cfg.minibatch_size):
            minibatch = [rows[i] for i in order[start : start + cfg.minibatch_size]]
            tokens = float(sum(len(r.response_ids) for r in minibatch))
            optimizer.zero_grad(set_to_none=True)
            for m in range(0, len(minibatch), cfg.micro_batch_size):
                micro = minibatch[m : m + cfg.micro_batch_size]
                batch = collate(micro, pad_id)
                weight = _weight(batch, tokens, len(minibatch), cfg.loss_agg)
                ids, attn, mask = batch["input_ids"], batch["attention_mask"], batch["mask"]
                logp = sequence_logprobs(keeper, ids, attn, temperature=cfg.temperature)
                advantages = torch.tensor([r.advantage for r in micro])
                loss, stats = policy_loss(logp, batch["old_logp"], advantages, mask, cfg.clip_eps,
                                          cfg.clip_eps_high, cfg.loss_agg, max_new_tokens, cfg.clip_ratio_c)
                stats["pg_loss"] = loss.item()
                # entropy of the distributions that produced the response tokens (logits at t-1 predict t)
                assert keeper.logits is not None
                predicting = mask[:, 1:] > 0
                with torch.set_grad_enabled(cfg.entropy_coef > 0):
                    entropy = entropy_from_logits(keeper.logits[:, :-1][predicting] / cfg.temperature).mean()
                stats["entropy"] = entropy.item()
                if cfg.entropy_coef > 0:
                    loss = loss - cfg.entropy_coef * entropy
                if ref_model is not None:
                    with torch.no_grad():
                        ref_logp = sequence_logprobs(ref_model, ids, attn, temperature=cfg.temperature)
                    kl = agg_loss(kl_penalty(logp, ref_logp, cfg.kl_estimator), mask, cfg.loss_agg, max_new_tokens)
                    loss = loss + cfg.kl_coef * kl
                    stats["kl"] = kl.item()
                stats["logp_behaviour_gap"] = masked_mean((logp.detach() - batch["old_logp"]).abs(), mask).item()
                (loss * weight).backward()
                for k, v in stats.items():
                    log.setdefault(k, []).append(v)
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            log.setdefault("grad_norm", []).append(float(grad_norm))
            if critic is not None and critic_optimizer is not None:
                log.setdefault("value_loss", []).append(_critic_step(critic, critic_optimizer, minibatch, cfg, pad_id))
    keeper.logits = None
    restore_modes()
    return {k: float(np.mean(v)) for k, v in log.items()}


def _critic_step(
    critic: Critic, optimizer: torch.optim.Optimizer, minibatch: list[TurnRow], cfg: RLConfig, pad_id: int
) -> float:
    """One clipped-value-loss step of the critic on a minibatch of turns (per-turn values, token-mean = turn mean)."""
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for m in range(0, len(minibatch), cfg.micro_batch_size):
        micro = minibatch[m : m + cfg.micro_batch_size]
        batch = collate(micro, pad_id, with_response=False)
        values = critic(batch["input_ids"], batch["attention_mask"])
        old = torch.tensor([r.old_value for r in micro])
        returns = torch.tensor([r.ret for r in micro])
        loss, _ = value_loss(values, old, returns, torch.ones_like(values), cfg.vf_clip)
        (loss * len(micro) / len(minibatch)).backward()
        total += loss.item() * len(micro) / len(minibatch)
    nn.utils.clip_grad_norm_(critic.parameters(), cfg.max_grad_norm)
    optimizer.step()
    return total


# ----------------------------------------------------------------------------------------- run state


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
    seconds: float = 0.0
    evals: list[dict[str, Any]] = field(default_factory=list)


CHECKPOINT, CHECKPOINT_TMP, CHECKPOINT_OLD = "checkpoint", "checkpoint.tmp", "checkpoint.old"
UNCHARGED = "uncharged_real_steps.json"  # real env steps taken since the last checkpoint (see RealStepJournal)


class RealStepJournal:
    """The real env steps of training rollouts taken after the checkpoint of iteration ``after``, on disk
    before each batched step. A killed attempt loses its uncommitted iterations but not the real interaction
    they used: the next attempt charges those steps to ``real_transitions``, so ``real_transition_budget``
    holds across kills. A kill inside a batched step charges the whole batch (at most ``num_envs`` more than
    were taken, never fewer: a paid budget is not exceeded).
    Tagging the steps with their checkpoint's iteration makes the save-then-reset pair safe: a kill between
    the two leaves a journal older than the checkpoint, which is then ignored (its steps are in it)."""

    def __init__(self, run: Path) -> None:
        self.path = run / UNCHARGED
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
    run: Path, policy: LLMPolicy, optimizer: torch.optim.Optimizer, critic: Critic | None,
    critic_optimizer: torch.optim.Optimizer | None, rng: np.random.Generator, state: TrainState,
    taskset: TaskSet | None = None,
) -> None:
    """Write the checkpoint to ``checkpoint.tmp`` and swap it in, so a kill never leaves a torn one."""
    tmp = run / CHECKPOINT_TMP
    shutil.rmtree(tmp, ignore_errors=True)
    llm: Any = policy.llm
    save_policy(tmp, llm.model, llm.tokenizer, policy.cfg)
    if taskset is not None:
        taskset.save(tmp / TASKS)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    if critic is not None and critic_optimizer is not None:
        critic.save(tmp / "critic.safetensors")
        torch.save(critic_optimizer.state_dict(), tmp / "critic_optimizer.pt")
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


def load_checkpoint(
    ckpt: Path, optimizer: torch.optim.Optimizer, critic: Critic | None,
    critic_optimizer: torch.optim.Optimizer | None, rng: np.random.Generator,
) -> TrainState:
    """Restore optimizer, critic and RNG states (the policy weights are loaded with the policy)."""
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
    if critic is not None and critic_optimizer is not None:
        critic.load(ckpt / "critic.safetensors")
        critic_optimizer.load_state_dict(torch.load(ckpt / "critic_optimizer.pt", weights_only=True))
    torch.set_rng_state(torch.load(ckpt / "torch_rng.pt", weights_only=True))
    states = json.loads((ckpt / "rng.json").read_text())
    rng.bit_generator.state = states["trainer"]
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return TrainState(**json.loads((ckpt / "state.json").read_text()))


# ----------------------------------------------------------------------------------------- the loop


def evaluate(policy: LLMPolicy, pool: EnvPool, cfg: RLConfig, state: TrainState) -> EvalResult:
    """Greedy episodes on the eval split (same tasks every time); their env steps are counted apart."""
    episodes = run_eval_episodes(policy, pool, cfg.eval_split, cfg.eval_episodes, seed=cfg.seed,
                                 greedy=True, max_steps=cfg.max_steps)
    state.eval_transitions += count_env_steps(episodes)
    result = summarize([e.to_trajectory(policy.name) for e in episodes])
    state.evals.append({"iteration": state.iteration, "real_transitions": state.real_transitions,
                        **result.to_dict()})
    return result


def write_summary(run: Path, cfg: RLConfig, state: TrainState) -> dict[str, Any]:
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
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def tasks_within_budget(cfg: RLConfig, used: int) -> int:
    """Tasks to roll out this iteration so that a real-transition budget is not overrun by a whole iteration.

    An episode takes at most ``max_steps`` env steps, so ``remaining // (group_size * max_steps)`` groups can
    never exceed the budget; when not even one group is certain to fit, one group still runs (the overshoot is
    then below ``group_size * max_steps`` transitions, and the counter reports it exactly), or, with
    ``cfg.strict_budget``, none does (0: training stops within the budget).
    """
    if cfg.real_transition_budget is None:
        return cfg.tasks_per_iter
    remaining = cfg.real_transition_budget - used
    fit = min(cfg.tasks_per_iter, remaining // (cfg.group_size * cfg.max_steps))
    return max(0 if cfg.strict_budget else 1, fit)


def train(cfg: RLConfig, run_dir: str | Path, resume: bool = False, console: Console | None = None) -> dict[str, Any]:
    """Run (or resume) RL training into ``run_dir``; returns the summary written to ``RUN/summary.json``."""
    from torch.utils.tensorboard import SummaryWriter

    console = console or Console(stderr=True)
    run = Path(run_dir)
    ckpt = checkpoint_dir(run) if resume else None
    if resume and ckpt is None:
        raise FileNotFoundError(f"{run}: no checkpoint to resume from")
    if not resume and checkpoint_dir(run) is not None:
        raise ValueError(f"{run}: already holds a run; pass --resume to continue it or choose another --out")
    if cfg.init is None:
        raise ValueError("RLConfig.init: give the policy to start from (a policy run dir or HF model dir)")
    check_horizon(cfg.max_steps, run if ckpt else cfg.init, f"the resumed run {run}" if ckpt else f"the policy {cfg.init}")
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
    console.print(yaml.safe_dump(cfg.model_dump(), sort_keys=False), highlight=False)
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)  # every trainer draw: task sampling, rollout seeds, minibatch order

    policy = load_policy(ckpt if ckpt is not None else cfg.init)
    policy.cfg = on_policy_config(policy.cfg, cfg.temperature, cfg.invalid_action_penalty, cfg.top_p)
    llm: Any = policy.llm
    model, tokenizer = llm.model, llm.tokenizer
    pad_id = llm.pad_id
    ref_model = None
    if cfg.kl_coef > 0:  # the frozen reference is the initial policy
        ref_model = load_policy(cfg.init).llm.model if ckpt is not None else copy.deepcopy(model)  # type: ignore[attr-defined]
        ref_model.eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    critic = critic_optimizer = None
    if cfg.algo == "ppo":
        critic = Critic.from_policy(model)
        critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.critic_lr, weight_decay=cfg.weight_decay)
    state = load_checkpoint(ckpt, optimizer, critic, critic_optimizer, rng) if ckpt else TrainState()
    journal = RealStepJournal(run)
    lost = journal.uncharged(state.iteration)
    journal.after, journal.steps = state.iteration, lost  # what a kill of this attempt must charge too
    state.real_transitions += lost
    if ckpt is not None:
        console.print(f"resumed {run} at iteration {state.iteration} ({state.real_transitions} real transitions)")
    if lost:
        console.print(f"charged {lost} real transitions that a killed attempt took after that checkpoint")

    # Rollouts run in `pool`: the real env, or the dream (M_exp + replay buffer, the real env only as the action
    # grammar). Evaluation always runs in the real env.
    num_envs = cfg.tasks_per_iter * cfg.group_size
    eval_pool: EnvPool | None = None
    if cfg.dream is None:
        pool: EnvPool = make_pool(make_env_factory(cfg), num_envs, cfg.env_backend)
        eval_pool = pool
    else:
        real_tasks = make_env_factory(cfg)()
        splits = {split: real_tasks.tasks(split) for split in {cfg.train_split, cfg.eval_split}}
        real_tasks.close()
        pool = open_dream(cfg.dream, cfg.env, cfg.env_kwargs, cfg.max_steps, splits, num_envs)
        if cfg.eval_episodes:
            eval_pool = make_pool(make_env_factory(cfg), min(cfg.eval_episodes, 64), cfg.env_backend)
    train_tasks = pool.tasks(cfg.train_split)
    if not train_tasks:
        raise ValueError(f"env {cfg.env!r} has no tasks in split {cfg.train_split!r}")
    # The task set: the env's tasks plus, in the dream, the curriculum's variations of high-variance tasks.
    taskset = TaskSet(train_tasks)
    if ckpt is not None and (ckpt / TASKS).exists():
        taskset = TaskSet.load(ckpt / TASKS)
    if ckpt is not None and isinstance(pool, DreamEnvPool) and pool.model.buffer is not None and state.buffer_rows is not None:
        # Synthetic transitions a killed attempt wrote after the checkpoint: the resumed run redoes that work, so
        # they stay hidden for the rest of the run (the ranges are checkpointed, in case of another kill).
        buffer = pool.model.buffer
        if len(buffer) > state.buffer_rows:
            state.hidden_rows.append([state.buffer_rows, len(buffer)])
            console.print(f"replay buffer: {len(buffer) - state.buffer_rows} rows written after the checkpoint are hidden")
        for start, stop in state.hidden_rows:
            buffer.hide_rows(start, stop)
    generator = _task_generator(cfg, pool)
    synthetic_share = cfg.dream.synthetic_share if cfg.dream is not None else 0.0
    writer = SummaryWriter(log_dir=str(run / "tb"), purge_step=state.iteration + 1 if ckpt else None)
    metrics_path = run / "metrics.jsonl"
    _truncate_metrics(metrics_path, state.iteration)
    started = time.monotonic() - state.seconds
    episodes: list[Episode] = []  # the last iteration's rollouts (a dream run's summary replays them: wm2real)
    try:
        if ckpt is None and cfg.eval_at_start and eval_pool is not None:
            result = evaluate(policy, eval_pool, cfg, state)
            console.print(f"iter 0 | eval success {result.success_rate:.3f} reward {result.mean_reward:.3f}")
        while state.iteration < cfg.iterations:
            if cfg.real_transition_budget is not None and state.real_transitions >= cfg.real_transition_budget:
                console.print(f"real-transition budget reached ({state.real_transitions} >= {cfg.real_transition_budget})")
                break
            # 1. rollouts: G episodes of each sampled task, one batched policy call per turn
            n_tasks = tasks_within_budget(cfg, state.real_transitions) if pool.source == "real" else cfg.tasks_per_iter
            if n_tasks == 0:  # only with strict_budget, i.e. with a real_transition_budget
                left = (cfg.real_transition_budget or 0) - state.real_transitions
                console.print(f"real-transition budget: {left} left, less "
                              f"than one group may take ({cfg.group_size} x {cfg.max_steps} steps); stopping")
                break
            state.iteration += 1
            it = state.iteration
            tasks = taskset.sample(n_tasks, random.Random(int(rng.integers(MAX_SEED))), synthetic_share)
            stats = RolloutStats()
            t0 = time.perf_counter()
            if isinstance(pool, DreamEnvPool):
                pool.iteration = it  # tags the synthetic transitions it writes back to the replay buffer
            episodes = collect_rollouts(pool, policy, tasks, cfg.group_size, cfg.max_steps, greedy=False,
                                        seed=int(rng.integers(MAX_SEED)), split=cfg.train_split, stats=stats,
                                        on_env_steps=journal.add if pool.source == "real" else None)
            rollout_s = time.perf_counter() - t0
            if pool.source == "real":
                state.real_transitions += count_env_steps(episodes)
            else:
                state.synthetic_transitions += count_env_steps(episodes)
            state.train_episodes += len(episodes)

            # 1b. curriculum: reward variance per group (GRPO: the task's group, logged in every run; PPO: a
            # cluster of tasks), then variations of the high-variance tasks join the task set
            returns = torch.tensor([e.env_return for e in episodes], dtype=torch.float64)
            variances: dict[str, float] = {}
            if cfg.algo == "grpo":
                variances = {str(k): v for k, v in reward_variance(returns, [e.task.task_id for e in episodes]).items()}
            elif generator is not None:
                clusters = cluster_groups(tasks, _encoder_of(pool), max(1, len(tasks) // 4), seed=it)
                by_cluster = reward_variance(returns, [clusters[e.task.task_id] for e in episodes])
                variances = {t.task_id: by_cluster[clusters[t.task_id]] for t in tasks}
            if generator is not None:
                new_tasks = generator.step(variances, taskset, it, random.Random(int(rng.integers(MAX_SEED))))
                state.synthetic_tasks += len(new_tasks)
            if cfg.save_rollouts:
                write_jsonl(run / "rollouts" / f"iter_{it:05d}.jsonl", [e.to_trajectory(policy.name) for e in episodes])

            # 2. advantages, one per turn
            t0 = time.perf_counter()
            rows = turn_rows(episodes)
            if critic is not None:
                for row, v in zip(rows, critic_values(critic, rows, pad_id, cfg.micro_batch_size), strict=True):
                    row.old_value = v
                ppo_advantages(episodes, rows, cfg, truncated_values(critic, policy, episodes, pad_id, cfg.micro_batch_size)
                               if cfg.bootstrap_truncated else None)
            else:
                grpo_advantages(episodes, rows, cfg.normalize_std, cfg.turn_weighting)

            # 3. clipped policy (and value) updates on minibatches of turns
            losses = update(model, ref_model, critic, optimizer, critic_optimizer, rows, cfg, pad_id,
                            policy.cfg.max_new_tokens, rng)
            update_s = time.perf_counter() - t0

            # 4. log, evaluate, checkpoint
            state.seconds = time.monotonic() - started
            metrics: dict[str, Any] = {
                "iteration": it, "real_transitions": state.real_transitions,
                "reward": float(np.mean([e.env_return for e in episodes])),
                "shaped_return": float(np.mean([e.shaped_return for e in episodes])),
                "success": float(np.mean([e.success for e in episodes])),
                "episode_steps": float(np.mean([e.env_steps for e in episodes])),
                "invalid_rate": sum(t.invalid for e in episodes for t in e.turns) / max(len(rows), 1),
                "synthetic_transitions": state.synthetic_transitions, "tasks": len(taskset),
                "tokens_per_s": stats.generated_tokens / max(stats.generation_s, 1e-9),
                "generation_s": stats.generation_s, "env_s": stats.env_s,
                "rollout_s": rollout_s, "update_s": update_s, **losses,
            }
            if variances:
                metrics["task_variances"] = sorted(variances.values())  # the curriculum's V per group
            if eval_pool is not None and ((cfg.eval_every and it % cfg.eval_every == 0) or it == cfg.iterations):
                result = evaluate(policy, eval_pool, cfg, state)
                metrics.update({"eval_success": result.success_rate, "eval_reward": result.mean_reward})
            for k, v in metrics.items():
                if isinstance(v, list):
                    if v:
                        writer.add_histogram(k, np.asarray(v), it)
                elif k != "iteration":
                    writer.add_scalar(k, v, it)
            with metrics_path.open("a") as f:
                f.write(json.dumps(metrics) + "\n")
            console.print(_progress_line(metrics), highlight=False, soft_wrap=True)
            if rows and metrics["invalid_rate"] >= 1.0:
                log.warning("iteration %d: every action was invalid, so the update learns nothing; does the policy's "
                            "action_format (%s) match how it was trained?", it, policy.cfg.action_format)
            if it % cfg.save_every == 0 or it == cfg.iterations:
                _save(run, policy, optimizer, critic, critic_optimizer, rng, state, taskset, pool)
                journal.committed(it)
        if not state.evals or state.evals[-1]["iteration"] != state.iteration:  # budget stop: a final evaluation
            if eval_pool is not None:
                evaluate(policy, eval_pool, cfg, state)
            _save(run, policy, optimizer, critic, critic_optimizer, rng, state, taskset, pool)
            journal.committed(state.iteration)
    finally:
        writer.close()
        pool.close()
        if eval_pool is not None and eval_pool is not pool:
            eval_pool.close()
    save_policy(run, model, tokenizer, policy.cfg)  # RUN is itself a policy run dir (dreamgym eval --policy RUN)
    summary = write_summary(run, cfg, state)
    if isinstance(pool, DreamEnvPool):
        from dreamgym.experience.fidelity import wm2real

        summary["experience_model"] = pool.model.stats_dict()
        # Dream to real: the last iteration's dreamt episodes replayed in the real env (its steps are not
        # counted in real_transitions: nothing is trained on them). None when no iteration ran in this call.
        dreamt = [e.to_trajectory(policy.name) for e in episodes]
        summary["wm2real"] = wm2real(dreamt, make_env_factory(cfg)) if dreamt else None
        (run / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary




def _save(run: Path, policy: LLMPolicy, optimizer: torch.optim.Optimizer, critic: Critic | None,
          critic_optimizer: torch.optim.Optimizer | None, rng: np.random.Generator, state: TrainState,
          taskset: TaskSet, pool: EnvPool) -> None:
    """Checkpoint (with the task set and the replay buffer's size) + the buffer's index snapshot in the dream."""
    if isinstance(pool, DreamEnvPool) and pool.model.buffer is not None:
        pool.model.buffer.flush()
        state.buffer_rows = len(pool.model.buffer)
    save_checkpoint(run, policy, optimizer, critic, critic_optimizer, rng, state, taskset)
    taskset.save(run / TASKS)  # a readable copy of the current task set beside the checkpoint


def _task_generator(cfg: RLConfig, pool: EnvPool) -> TaskGenerator | None:
    """The curriculum's task generator (dream runs only; the real env's task set stays fixed)."""
    if cfg.dream is None or cfg.dream.seeds_per_iter == 0:
        return None
    llm = pool.model.llm if isinstance(pool, DreamEnvPool) else None
    operator = variation_operator(cfg.dream.task_generator, cfg.env, cfg.env_kwargs, llm)
    if operator is None:
        return None
    return TaskGenerator(operator, cfg.dream.seeds_per_iter, cfg.dream.variations_per_seed)


def _encoder_of(pool: EnvPool) -> Any:
    """The semantic embedder for PPO's task clusters: the replay buffer's φ, else the hashing encoder."""
    from dreamgym.replay import HashingEncoder

    buffer = pool.model.buffer if isinstance(pool, DreamEnvPool) else None
    return buffer.encoder if buffer is not None else HashingEncoder()


def _truncate_metrics(path: Path, iteration: int) -> None:
    """Drop metric lines past the checkpoint a resumed run restarts from."""
    if not path.exists():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["iteration"] <= iteration]
    path.write_text("".join(ln + "\n" for ln in lines))


def _progress_line(m: dict[str, Any]) -> str:
    kl = f"kl {m['kl']:.4f}" if "kl" in m else f"kl(old) {m['approx_kl']:.4f}"  # to the reference, else to π_old
    line = (
        f"iter {m['iteration']:>4} | reward {m['reward']:.3f} | success {m['success']:.2f} | invalid "
        f"{m['invalid_rate']:.2f} | {kl} | entropy {m['entropy']:.3f} | tok/s {m['tokens_per_s']:.0f} | "
        f"real {m['real_transitions']} | gen {m['generation_s']:.1f}s env {m['env_s']:.1f}s update {m['update_s']:.1f}s"
    )
    if "eval_success" in m:
        line += f" | [bold]eval success {m['eval_success']:.3f}[/bold]"
    return line


__all__ = ["RLConfig", "TrainState", "TurnRow", "make_env_factory", "train", "turn_rows", "update"]
