"""The learner: the policy π_θ being trained, the frozen reference π_ref, PPO's critic, and their optimizers.

:meth:`Learner.update` makes ``ppo_epochs`` passes over shuffled minibatches of turns: log-probs recomputed with
``sequence_logprobs``, the clipped policy loss, k3 KL to π_ref (only when ``kl_coef > 0``), an optional entropy
bonus, AdamW with gradient clipping; PPO also fits the critic with the clipped value loss.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dreamgym.agent.policy import LLMPolicy, load_policy
from dreamgym.rl.batch import TurnRow, collate
from dreamgym.rl.config import RLConfig
from dreamgym.rl.critic import Critic
from dreamgym.rl.losses import (
    AggMode,
    agg_loss,
    dropout_off,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    policy_loss,
    sequence_logprobs,
    value_loss,
)


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


class Learner:
    """π_θ (``policy``'s model, trained in place), π_ref (the initial policy, frozen; only with ``kl_coef > 0``;
    ``resumed``: reloaded from ``cfg.init`` since π_θ has moved on) and, for PPO, the critic V."""

    def __init__(self, policy: LLMPolicy, cfg: RLConfig, resumed: bool = False) -> None:
        llm: Any = policy.llm
        self.policy, self.cfg = policy, cfg
        self.model: nn.Module = llm.model
        self.pad_id: int = llm.pad_id
        self.ref_model: nn.Module | None = None
        if cfg.kl_coef > 0:
            if resumed:
                assert cfg.init is not None, "a resumed run starts from RLConfig.init"
                self.ref_model = load_policy(cfg.init).llm.model  # type: ignore[attr-defined]
            else:
                self.ref_model = copy.deepcopy(self.model)
            self.ref_model.eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.critic: Critic | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        if cfg.algo == "ppo":
            self.critic = Critic.from_policy(self.model)
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr,
                                                      weight_decay=cfg.weight_decay)

    @property
    def max_new_tokens(self) -> int:
        return self.policy.cfg.max_new_tokens

    @torch.no_grad()
    def values(self, rows: Sequence[TurnRow]) -> list[float]:
        """The critic's V(s_t) of each turn's prompt."""
        assert self.critic is not None
        values: list[float] = []
        for start in range(0, len(rows), self.cfg.micro_batch_size):
            batch = collate(rows[start : start + self.cfg.micro_batch_size], self.pad_id, with_response=False)
            values.extend(self.critic(batch["input_ids"], batch["attention_mask"]).tolist())
        return values

    def update(self, rows: Sequence[TurnRow], rng: np.random.Generator) -> dict[str, float]:
        """``ppo_epochs`` passes of minibatch updates over ``rows``; returns the mean of each logged quantity."""
        cfg = self.cfg
        log: dict[str, list[float]] = {}
        keeper = _KeepLogits(self.model)
        # old and new log-probs (and values) without dropout, so the first ratio is exactly 1 for any model
        restore_modes = dropout_off(self.model, self.critic)
        for _ in range(cfg.ppo_epochs):
            order = rng.permutation(len(rows))
            for start in range(0, len(rows), cfg.minibatch_size):
                minibatch = [rows[i] for i in order[start : start + cfg.minibatch_size]]
                tokens = float(sum(len(r.response_ids) for r in minibatch))
                self.optimizer.zero_grad(set_to_none=True)
                for m in range(0, len(minibatch), cfg.micro_batch_size):
                    micro = minibatch[m : m + cfg.micro_batch_size]
                    batch = collate(micro, self.pad_id)
                    loss, stats = self._policy_loss(keeper, batch, micro)
                    (loss * _weight(batch, tokens, len(minibatch), cfg.loss_agg)).backward()
                    for k, v in stats.items():
                        log.setdefault(k, []).append(v)
                grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                log.setdefault("grad_norm", []).append(float(grad_norm))
                if self.critic is not None:
                    log.setdefault("value_loss", []).append(self._critic_step(minibatch))
        keeper.logits = None
        restore_modes()
        return {k: float(np.mean(v)) for k, v in log.items()}

    def _policy_loss(
        self, keeper: _KeepLogits, batch: dict[str, Tensor], micro: Sequence[TurnRow]
    ) -> tuple[Tensor, dict[str, float]]:
        """A micro-batch's clipped policy loss (− entropy bonus, + KL to π_ref) and its logged quantities."""
        cfg = self.cfg
        ids, attn, mask = batch["input_ids"], batch["attention_mask"], batch["mask"]
        logp = sequence_logprobs(keeper, ids, attn, temperature=cfg.temperature)
        advantages = torch.tensor([r.advantage for r in micro])
        loss, stats = policy_loss(logp, batch["old_logp"], advantages, mask, cfg.clip_eps, cfg.clip_eps_high,
                                  cfg.loss_agg, self.max_new_tokens, cfg.clip_ratio_c)
        stats["pg_loss"] = loss.item()
        # entropy of the distributions that produced the response tokens (logits at t-1 predict t)
        assert keeper.logits is not None
        predicting = mask[:, 1:] > 0
        with torch.set_grad_enabled(cfg.entropy_coef > 0):
            entropy = entropy_from_logits(keeper.logits[:, :-1][predicting] / cfg.temperature).mean()
        stats["entropy"] = entropy.item()
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * entropy
        if self.ref_model is not None:
            with torch.no_grad():
                ref_logp = sequence_logprobs(self.ref_model, ids, attn, temperature=cfg.temperature)
            kl = agg_loss(kl_penalty(logp, ref_logp, cfg.kl_estimator), mask, cfg.loss_agg, self.max_new_tokens)
            loss = loss + cfg.kl_coef * kl
            stats["kl"] = kl.item()
        stats["logp_behaviour_gap"] = masked_mean((logp.detach() - batch["old_logp"]).abs(), mask).item()
        return loss, stats

    def _critic_step(self, minibatch: list[TurnRow]) -> float:
        """One clipped-value-loss step of the critic on a minibatch of turns (per-turn values, token-mean = turn
        mean)."""
        assert self.critic is not None and self.critic_optimizer is not None
        cfg = self.cfg
        self.critic_optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(0, len(minibatch), cfg.micro_batch_size):
            micro = minibatch[m : m + cfg.micro_batch_size]
            batch = collate(micro, self.pad_id, with_response=False)
            values = self.critic(batch["input_ids"], batch["attention_mask"])
            old = torch.tensor([r.old_value for r in micro])
            returns = torch.tensor([r.ret for r in micro])
            loss, _ = value_loss(values, old, returns, torch.ones_like(values), cfg.vf_clip)
            (loss * len(micro) / len(minibatch)).backward()
            total += loss.item() * len(micro) / len(minibatch)
        nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.max_grad_norm)
        self.critic_optimizer.step()
        return total


__all__ = ["Learner"]
