"""The learner: the policy π_θ being trained, the frozen reference π_ref, PPO's critic, and their optimizers.

:meth:`Learner.update` makes ``ppo_epochs`` passes over shuffled minibatches of turns: log-probs recomputed with
``sequence_logprobs``, the clipped policy loss, k3 KL to π_ref (only when ``kl_coef > 0``), an optional entropy
bonus, AdamW with gradient clipping; PPO also fits the critic with the clipped value loss.

Data-parallel (:mod:`dreamgym.rl.distributed`): the models train through their ``accelerator.prepare`` wrappers;
every rank walks the same permutation of the GLOBAL rows (all ranks' rows, rank order) and computes the rows of
each minibatch that it holds, each weighted by its share of the global minibatch times the world size (DDP
averages the ranks' gradients), so the all-reduced gradient is the 1-process gradient of that minibatch.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dreamgym.agent.policy import LLMPolicy, load_policy
from dreamgym.rl.batch import TurnRow, collate, response_window
from dreamgym.rl.config import RLConfig
from dreamgym.rl.critic import Critic
from dreamgym.rl.distributed import Dist, owned
from dreamgym.rl.losses import (
    AggMode,
    agg_loss,
    allowed_vocab,
    dropout_off,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    policy_loss,
    restrict_logprobs,
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

    def __init__(self, policy: LLMPolicy, cfg: RLConfig, resumed: bool = False, dist: Dist | None = None) -> None:
        llm: Any = policy.llm
        self.policy, self.cfg, self.dist = policy, cfg, dist or Dist()
        self.model: nn.Module = llm.model  # unwrapped: rollouts generate with it, checkpoints save it
        self.pad_id: int = llm.pad_id
        # the loss needs the LM head only where a response token is predicted: left-padded micro-batches and
        # Hugging Face's logits_to_keep (a model without it gets the whole sequence's logits, as before)
        self.window = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.ref_model: nn.Module | None = None
        if cfg.kl_coef > 0:
            if resumed:
                assert cfg.init is not None, "a resumed run starts from RLConfig.init"
                self.ref_model = load_policy(cfg.init, dtype=cfg.dtype).llm.model  # type: ignore[attr-defined]
            else:
                self.ref_model = copy.deepcopy(self.model)
            self.ref_model.eval().requires_grad_(False).to(self.dist.device)
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.train_model, self.optimizer = self.dist.prepare(self.model, optimizer)  # DDP & co.: trained through
        self.critic: Critic | None = None
        self.train_critic: nn.Module | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        if cfg.algo == "ppo":
            self.critic = Critic.from_policy(self.model)
            critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr,
                                                 weight_decay=cfg.weight_decay)
            self.train_critic, self.critic_optimizer = self.dist.prepare(self.critic, critic_optimizer)

    @property
    def max_new_tokens(self) -> int:
        return self.policy.cfg.max_new_tokens

    @torch.no_grad()
    def values(self, rows: Sequence[TurnRow]) -> list[float]:
        """The critic's V(s_t) of each turn's prompt."""
        assert self.critic is not None
        values: list[float] = []
        for start in range(0, len(rows), self.cfg.micro_batch_size):
            batch = self._collate(rows[start : start + self.cfg.micro_batch_size], with_response=False)
            values.extend(self.critic(batch["input_ids"], batch["attention_mask"]).tolist())
        return values

    def update(self, rows: Sequence[TurnRow], rng: np.random.Generator) -> dict[str, float]:
        """``ppo_epochs`` passes of minibatch updates over the rows of every rank (``rows``: this rank's share);
        returns the mean of each logged quantity over all ranks."""
        cfg, dist = self.cfg, self.dist
        log: dict[str, list[float]] = {}
        keeper = _KeepLogits(self.train_model)
        # every rank's response lengths: the global minibatches and their token counts (one process: ``rows``)
        lengths = [n for share in dist.gather([len(r.response_ids) for r in rows]) for n in share]
        lo = sum(dist.gather(len(rows))[: dist.rank])  # this rank's first global row
        # old and new log-probs (and values) without dropout, so the first ratio is exactly 1 for any model
        restore_modes = dropout_off(self.model, self.critic)
        for _ in range(cfg.ppo_epochs):
            order = rng.permutation(len(lengths))
            for start in range(0, len(lengths), cfg.minibatch_size):
                members = order[start : start + cfg.minibatch_size]
                minibatch = [rows[i] for i in owned(list(members), lo, lo + len(rows))]
                # micro-batches of similar lengths pad less; the minibatch's gradient is their sum all the same
                minibatch.sort(key=lambda r: len(r.prompt_ids) + len(r.response_ids))
                tokens = float(sum(lengths[i] for i in members))
                self.optimizer.zero_grad(set_to_none=True)
                micros = [minibatch[m : m + cfg.micro_batch_size] for m in range(0, len(minibatch), cfg.micro_batch_size)]
                for j, micro in enumerate(micros or [[]]):  # a rank holding none of it still joins the all-reduce
                    with dist.no_sync(self.train_model, skip=j < len(micros) - 1):
                        if not micro:
                            dist.backward(self._nothing(keeper))
                            continue
                        batch = self._collate(micro, left=self.window)
                        loss, stats = self._policy_loss(keeper, batch, micro)
                        weight = _weight(batch, tokens, len(members), cfg.loss_agg)
                        dist.backward(loss * (weight * dist.world_size if dist.world_size > 1 else weight))
                    for k, v in stats.items():
                        log.setdefault(k, []).append(v)
                grad_norm = dist.clip_grad_norm_(self.train_model, cfg.max_grad_norm)
                self.optimizer.step()
                log.setdefault("grad_norm", []).append(float(grad_norm))
                if self.critic is not None:
                    # this rank's part of the minibatch loss, times the world size: the mean over ranks is their sum
                    part = self._critic_step(minibatch, len(members))
                    log.setdefault("value_loss", []).append(part * dist.world_size if dist.world_size > 1 else part)
        keeper.logits = None
        restore_modes()
        merged: dict[str, list[float]] = {}
        for share in dist.gather(log):  # every rank's micro-batch values (one process: ``log`` itself)
            for k, v in share.items():
                merged.setdefault(k, []).extend(v)
        return {k: float(np.mean(v)) for k, v in merged.items()}

    def _collate(self, rows: Sequence[TurnRow], with_response: bool = True, left: bool = False) -> dict[str, Tensor]:
        batch = collate(rows, self.pad_id, with_response, left)
        if self.dist.device.type == "cpu":
            return batch
        return {k: v.to(self.dist.device) for k, v in batch.items()}

    def _nothing(self, model: nn.Module, critic: bool = False) -> Tensor:
        """A zero loss through every parameter: the part of a rank that holds no row of a minibatch."""
        ids = torch.full((1, 1), self.pad_id, dtype=torch.long, device=self.dist.device)
        out = model(ids, torch.ones_like(ids)) if critic else model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        return out.sum() * 0.0

    def _policy_loss(
        self, keeper: _KeepLogits, batch: dict[str, Tensor], micro: Sequence[TurnRow]
    ) -> tuple[Tensor, dict[str, float]]:
        """A micro-batch's clipped policy loss (− entropy bonus, + KL to π_ref) and its logged quantities."""
        cfg = self.cfg
        ids, attn, mask, old_logp = batch["input_ids"], batch["attention_mask"], batch["mask"], batch["old_logp"]
        keep = response_window(micro) if self.window else None  # the batch is left-padded then
        logp = sequence_logprobs(keeper, ids, attn, temperature=cfg.temperature, keep=keep)
        if keep is not None:  # every tensor of the loss over the same final positions as the logits
            mask, old_logp = mask[:, -keep:], old_logp[:, -keep:]
        assert keeper.logits is not None
        vocab = None  # action masking: the tokens each response token was sampled among
        if any(r.allowed_ids is not None for r in micro):
            vocab = allowed_vocab(mask, [r.allowed_ids for r in micro], keeper.logits.shape[-1])
            logp = restrict_logprobs(logp, keeper.logits, mask, vocab, cfg.temperature)
        advantages = torch.tensor([r.advantage for r in micro], device=logp.device)
        loss, stats = policy_loss(logp, old_logp, advantages, mask, cfg.clip_eps, cfg.clip_eps_high,
                                  cfg.loss_agg, self.max_new_tokens, cfg.clip_ratio_c)
        stats["pg_loss"] = loss.item()
        # entropy of the distributions that produced the response tokens (logits at t-1 predict t)
        predicting = mask[:, 1:] > 0
        with torch.set_grad_enabled(cfg.entropy_coef > 0):
            logits = keeper.logits[:, :-1][predicting] / cfg.temperature
            entropy = entropy_from_logits(logits if vocab is None else logits.masked_fill(~vocab, float("-inf"))).mean()
        stats["entropy"] = entropy.item()
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * entropy
        if self.ref_model is not None:
            with torch.no_grad():
                ref = _KeepLogits(self.ref_model)
                ref_logp = sequence_logprobs(ref, ids, attn, temperature=cfg.temperature, keep=keep)
                if vocab is not None:
                    assert ref.logits is not None
                    ref_logp = restrict_logprobs(ref_logp, ref.logits, mask, vocab, cfg.temperature)
            kl = agg_loss(kl_penalty(logp, ref_logp, cfg.kl_estimator), mask, cfg.loss_agg, self.max_new_tokens)
            loss = loss + cfg.kl_coef * kl
            stats["kl"] = kl.item()
        stats["logp_behaviour_gap"] = masked_mean((logp.detach() - old_logp).abs(), mask).item()
        return loss, stats

    def _critic_step(self, minibatch: list[TurnRow], size: int) -> float:
        """One clipped-value-loss step of the critic on this rank's turns of a minibatch of ``size`` turns (all
        ranks) (per-turn values, token-mean = turn mean); returns this rank's part of the minibatch loss."""
        assert self.train_critic is not None and self.critic_optimizer is not None
        cfg, dist = self.cfg, self.dist
        self.critic_optimizer.zero_grad(set_to_none=True)
        total = 0.0
        micros = [minibatch[m : m + cfg.micro_batch_size] for m in range(0, len(minibatch), cfg.micro_batch_size)]
        for j, micro in enumerate(micros or [[]]):
            with dist.no_sync(self.train_critic, skip=j < len(micros) - 1):
                if not micro:
                    dist.backward(self._nothing(self.train_critic, critic=True))
                    continue
                batch = self._collate(micro, with_response=False)
                values = self.train_critic(batch["input_ids"], batch["attention_mask"])
                old = torch.tensor([r.old_value for r in micro], device=values.device)
                returns = torch.tensor([r.ret for r in micro], device=values.device)
                loss, _ = value_loss(values, old, returns, torch.ones_like(values), cfg.vf_clip)
                dist.backward(loss * len(micro) / size * dist.world_size if dist.world_size > 1 else loss * len(micro) / size)
                total += loss.item() * len(micro) / size
        dist.clip_grad_norm_(self.train_critic, cfg.max_grad_norm)
        self.critic_optimizer.step()
        return total


__all__ = ["Learner"]
