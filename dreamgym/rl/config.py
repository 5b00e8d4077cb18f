"""The RL run's configuration (``RUN/config.yaml``) and the pools it rolls out and evaluates in."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dreamgym.curriculum.config import CURRICULUM_FIELDS, CurriculumConfig
from dreamgym.envs.base import Split
from dreamgym.envs.latency import with_latency
from dreamgym.envs.pool import EnvFactory, EnvPool, env_factory, make_pool
from dreamgym.experience.dream import DreamConfig, open_dream
from dreamgym.rl.losses import AggMode, KLKind, check_kl_loss
from dreamgym.rl.weight_sync import RolloutServer


class RLConfig(BaseModel):
    """Everything a run needs; saved as ``RUN/config.yaml``. Defaults suit the CPU tiny policy."""

    model_config = ConfigDict(extra="forbid")

    algo: Literal["grpo", "ppo"] = "grpo"
    init: str | None = Field(default=None, description="policy run dir or HF model dir to start from")
    env: str = "shop"
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    env_backend: Literal["local", "ray"] = "local"
    train_split: Split = "train"
    eval_split: Split = Field(default="test", description="val for every choice of settings; test for final tables")
    # rollouts
    iterations: int = Field(default=20, ge=1)
    tasks_per_iter: int = Field(default=8, ge=1, description="16 in the paper")
    group_size: int = Field(default=8, ge=1)
    max_steps: int = Field(default=15, ge=1)
    temperature: float = Field(default=1.0, gt=0, description="sampling temperature (log-probs use it too)")
    invalid_action_penalty: float = Field(default=0.1, ge=0)
    no_effect_penalty: float = Field(
        default=0.0, ge=0, description="subtracted from the reward of a valid step the env (or, in the dream, the "
        "real env reading the dreamt page) says changed nothing but its feedback (info['no_effect'], "
        "TextEnv.had_effect): a command the game accepts and refuses, e.g. TextWorld's 'prepare meal' with an "
        "ingredient missing; it goes where invalid_penalty_mode puts the invalid-action penalty")
    reward: Literal["env", "success"] = Field(
        default="env", description="what RL optimises: 'env' = the env's reward (the shop's graded WebShop score "
        "at purchase); 'success' = the paper's outcome reward, 1 on the final step of a successful episode, else 0 "
        "(in the dream, M_exp's success flag); invalid-action penalties apply to both")
    action_masking: bool = Field(
        default=False, description="sample each rollout answer among the admissible actions' answers only (the "
        "policy's sampling='admissible': a token trie), and score its tokens under the same masked softmax in the "
        "loss (invalid action masking); the policy's greedy decoding, in evaluations too, is then guided to them as "
        "well (decoding='admissible'); needs in-process rollouts (rollout_server unset)")
    invalid_penalty_mode: Literal["episode", "step"] = Field(
        default="episode", description="GRPO: 'episode' = the penalties are in the shaped return every turn's "
        "group advantage is computed from (spread over the episode); 'step' = the group advantage of the env return "
        "only, and each invalid turn's own advantage minus the raw penalty (verl-agent; not divided by the std)")
    real_transition_budget: int | None = Field(
        default=None, ge=1, description="stop once this many are used; the last iterations shrink to fit it")
    strict_budget: bool = Field(default=False, description="never exceed real_transition_budget: stop when not "
                                "even one group of episodes is certain to fit (else one more group runs)")
    # a real env's cost (issue 13, item 5; dreamgym.envs.latency): every reset and step of the real env in
    # training rollouts sleeps real_latency_s, at most real_sessions at once; the dream is never slowed
    real_latency_s: float = Field(default=0.0, ge=0, description="seconds per real env reset/step (0: off)")
    real_sessions: int = Field(default=1, ge=1, description="real env sessions that may step at once")
    real_latency_eval: bool = Field(default=False, description="evaluation episodes pay the latency too (off: "
                                    "the cost charged is the training interaction's, as in the paper)")
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
    step_advantage_weight: float = Field(
        default=0.0, ge=0, description="GRPO: GiGPO's ω (Feng et al. 2025). Each turn's advantage adds ω × its step "
        "advantage: its discounted return from the state it acted in, against those of the group's other turns "
        "taken in the very same state (0: plain GRPO; GiGPO uses 1)")
    step_gamma: float = Field(default=0.95, ge=0, le=1, description="GRPO with step_advantage_weight: the discount "
                              "of the step returns (GiGPO's 0.95)")
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
    device: str = Field(default="cpu", description="torch device of a 1-process run (under accelerate: the rank's)")
    dtype: Literal["float32", "bfloat16"] = Field(default="float32", description="the policy's (and critic's) "
                                                  "weights: bfloat16 trains them in bf16 (GPU; no fp32 master copy)")
    # rollouts through an OpenAI-compatible server with weight sync (dreamgym.rl.weight_sync); None: in process
    rollout_server: RolloutServer | None = None
    # DreamGym: roll out in the experience model's dream instead of the real env (None: the real env)
    dream: DreamConfig | None = None
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig, description="dream runs only")

    @model_validator(mode="before")
    @classmethod
    def _curriculum_from_dream(cls, data: Any) -> Any:
        """Configs written before ``curriculum`` existed set its fields inside ``dream``: they move there."""
        if not isinstance(data, dict) or not isinstance(data.get("dream"), dict):
            return data
        moved = {k: v for k, v in data["dream"].items() if k in CURRICULUM_FIELDS}
        if not moved:
            return data
        given = data.get("curriculum") or {}
        given = given.model_dump(exclude_unset=True) if isinstance(given, BaseModel) else given
        dream = {k: v for k, v in data["dream"].items() if k not in CURRICULUM_FIELDS}
        return {**data, "dream": dream, "curriculum": {**moved, **given}}

    @model_validator(mode="after")
    def _check(self) -> RLConfig:
        if self.algo == "grpo" and self.group_size < 2:
            raise ValueError("GRPO needs group_size >= 2 (a group of one has no baseline)")
        if self.algo != "grpo" and self.step_advantage_weight > 0:
            raise ValueError("step_advantage_weight is GiGPO's step term of GRPO; PPO's GAE already gives each turn "
                             "its own advantage (set algo=grpo, or step_advantage_weight=0)")
        if self.real_latency_s > 0 and self.env_backend == "ray":
            raise ValueError("real_latency_s needs env_backend=local (the sessions are bounded per process; "
                             "every Ray actor would get its own)")
        if self.action_masking and self.rollout_server is not None:
            raise ValueError("action_masking needs in-process rollouts (rollout_server unset): a server does not "
                             "return the token sets it sampled among, so the loss could not score under the same mask")
        if self.rollout_server is not None and self.rollout_server.sync == "vllm_lora":
            raise ValueError("rollout_server.sync=vllm_lora loads LoRA adapters, and the RL trainer updates every "
                             "weight; use sync=dreamgym (dreamgym serve) or sync=sglang")
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


def make_env_factory(cfg: RLConfig, charged: bool = False) -> EnvFactory:
    """The one place the trainer creates envs; ``charged``: they pay ``real_latency_s`` with ``real_sessions``
    (:func:`~dreamgym.envs.latency.with_latency`; the same factory when the latency is 0)."""
    factory = env_factory(cfg.env, **cfg.env_kwargs)
    return with_latency(factory, cfg.real_latency_s, cfg.real_sessions) if charged else factory


def open_pools(cfg: RLConfig) -> tuple[EnvPool, EnvPool | None]:
    """The pool rollouts run in (the real env, or the dream: M_exp + replay buffer, the real env only as the
    action grammar) and the one evaluations run in (always the real env; None when a dream run evaluates nothing).

    With ``real_latency_s`` the real training pool pays it; the evaluation pool only with ``real_latency_eval``
    (else a second, latency-free pool of the same size evaluates). The dream never pays it."""
    num_envs = cfg.tasks_per_iter * cfg.group_size
    if cfg.dream is None:
        pool = make_pool(make_env_factory(cfg, charged=True), num_envs, cfg.env_backend)
        if not cfg.eval_episodes:
            return pool, None
        if cfg.real_latency_s == 0 or cfg.real_latency_eval:
            return pool, pool
        return pool, make_pool(make_env_factory(cfg), num_envs, cfg.env_backend)
    real_tasks = make_env_factory(cfg)()
    splits = {str(split): real_tasks.tasks(split) for split in {cfg.train_split, cfg.eval_split}}
    real_tasks.close()
    dream = open_dream(cfg.dream, cfg.env, cfg.env_kwargs, cfg.max_steps, splits, num_envs)
    if not cfg.eval_episodes:
        return dream, None
    eval_factory = make_env_factory(cfg, charged=cfg.real_latency_eval)
    return dream, make_pool(eval_factory, min(cfg.eval_episodes, 64), cfg.env_backend)


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


__all__ = ["RLConfig", "make_env_factory", "open_pools", "tasks_within_budget"]
