"""Turn batches: one row per turn (prompt + response, loss mask on the response), with its advantage.

GRPO: every turn of an episode gets its episode's group-normalised return (plus, with GiGPO's step weight, its
step group's relative return); PPO: turn-level GAE(γ, λ) with the
critic's V(s_t) (:mod:`dreamgym.rl.advantages`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dreamgym.rl.advantages import episode_gae, group_advantages, step_advantages
from dreamgym.rl.config import RLConfig
from dreamgym.rl.distributed import Dist
from dreamgym.rl.losses import masked_whiten
from dreamgym.rl.rollout import Episode


@dataclass
class TurnRow:
    """One turn as a training row: prompt (context) + response (trained), with its targets."""

    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    advantage: float = 0.0
    ret: float = 0.0  # PPO: the critic's regression target (λ-return)
    old_value: float = 0.0  # PPO: V(s_t) at rollout time
    allowed_ids: list[list[int]] | None = None  # action masking: per response token, the ids it was sampled among


def turn_rows(episodes: Sequence[Episode]) -> list[TurnRow]:
    rows = []
    for e in episodes:
        for t in e.turns:
            if t.logprobs is None:
                raise ValueError("training needs sampled rollouts with log-probs (greedy=False)")
            rows.append(TurnRow(t.prompt_ids, t.response_ids, t.logprobs, allowed_ids=t.allowed_ids))
    return rows


def collate(rows: Sequence[TurnRow], pad_id: int, with_response: bool = True, left: bool = False) -> dict[str, Tensor]:
    """Right-padded (``left``: left-padded) ``input_ids``/``attention_mask`` [B, L]; ``mask`` is 1 on response
    tokens only, and ``old_logp`` holds the behaviour log-probs at those positions (aligned with the token they
    score). Left-padded, every row's response ends the row: the last max-response + 1 positions hold all the
    positions that predict a response token (:func:`response_window`)."""
    seqs = [r.prompt_ids + r.response_ids if with_response else r.prompt_ids for r in rows]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width))
    old_logp = torch.zeros((len(rows), width))
    for i, (r, s) in enumerate(zip(rows, seqs, strict=True)):
        start = width - len(s) if left else 0
        ids[i, start : start + len(s)] = torch.tensor(s)
        attn[i, start : start + len(s)] = 1
        if with_response:
            first, end = start + len(r.prompt_ids), start + len(s)
            mask[i, first:end] = 1.0
            old_logp[i, first:end] = torch.tensor(r.old_logprobs)
    return {"input_ids": ids, "attention_mask": attn, "mask": mask, "old_logp": old_logp}


def response_window(rows: Sequence[TurnRow]) -> int:
    """How many final positions of a left-padded batch (:func:`collate` with ``left``) hold every response token
    and the prompt token before each row's first: the longest response + 1. The loss needs the LM head on those
    positions only (``logits_to_keep``), not on the prompts' hundreds."""
    return max(len(r.response_ids) for r in rows) + 1


def grpo_advantages(
    episodes: Sequence[Episode], rows: list[TurnRow], normalize_std: bool, turn_weighting: str = "token",
    invalid_penalty_mode: str = "episode", dist: Dist | None = None, step_weight: float = 0.0,
    step_gamma: float = 0.95,
) -> dict[str, float]:
    """GRPO: every turn of an episode gets its episode's group-normalised return; with
    ``turn_weighting="episode"`` scaled by mean_turns / turns, so every episode weighs the same in the loss.

    With ``step_weight`` ω > 0 each turn also gets ω × its step-level advantage (GiGPO, Feng et al. 2025,
    :func:`~dreamgym.rl.advantages.step_advantages`): the turns of one group that acted in the very same state
    (the anchor) form a step group, and a turn's discounted return from that state (``step_gamma``) is compared
    with the step group's mean (normalised like the episode term). A state reached once has no baseline and adds 0.
    Returns the step groups' statistics for the run's metrics (empty without ``step_weight``).

    Where the invalid-action penalty goes (``invalid_penalty_mode``; the no-effect penalty,
    ``RLConfig.no_effect_penalty``, goes the same way):

    * ``"episode"`` (the default): the return is the shaped one (env rewards plus the penalties), so an invalid
      turn lowers the advantage of every turn of its episode;
    * ``"step"`` (verl-agent): the return is the task's rewards only (:meth:`Episode.task_rewards`: the env's, or
      the outcome with ``RLConfig.reward="success"``), and each invalid turn's own advantage is lowered by the raw
      penalty (its task reward minus ``Turn.reward``), not divided by the group std even with
      ``normalize_std`` (a group of equal env returns has std 0, which would blow the penalty up) and not scaled
      by the episode turn weighting (it belongs to the turn, not the episode).

    With ``dist`` (data-parallel; the groups never straddle ranks) ``mean_turns`` is over every rank's episodes.
    """
    if invalid_penalty_mode not in ("episode", "step"):
        raise ValueError(f"unknown invalid_penalty_mode {invalid_penalty_mode!r}; use episode | step")
    step = invalid_penalty_mode == "step"
    task_rewards = [e.task_rewards() for e in episodes]
    returns = torch.tensor([sum(r) if step else e.shaped_return for e, r in zip(episodes, task_rewards, strict=True)],
                           dtype=torch.float64)
    advantages = group_advantages(returns, [e.group_id for e in episodes], normalize_std=normalize_std)
    mean_turns = sum(len(e.turns) for e in episodes) / max(len(episodes), 1)
    if dist is not None and dist.world_size > 1 and turn_weighting == "episode":
        shares = dist.gather((sum(len(e.turns) for e in episodes), len(episodes)))
        mean_turns = sum(t for t, _ in shares) / max(sum(n for _, n in shares), 1)
    scale = [mean_turns / max(len(e.turns), 1) if turn_weighting == "episode" else 1.0 for e in episodes]
    turn_adv = [float(a) * w + ((t.reward - r) if step else 0.0)
                for e, a, w, rs in zip(episodes, advantages, scale, task_rewards, strict=True)
                for t, r in zip(e.turns, rs, strict=True)]
    stats: dict[str, float] = {}
    if step_weight > 0:
        rewards = [list(rs) if step else [t.reward for t in e.turns] for e, rs in zip(episodes, task_rewards, strict=True)]
        anchors = [[(e.group_id, t.state) for t in e.turns] for e in episodes]
        step_adv, stats = step_advantages(rewards, anchors, step_gamma, normalize_std)
        turn_adv = [a + step_weight * s for a, s in zip(turn_adv, step_adv, strict=True)]
    for row, a in zip(rows, turn_adv, strict=True):
        row.advantage = a
    return stats


def ppo_advantages(
    episodes: Sequence[Episode], rows: list[TurnRow], cfg: RLConfig, last_values: Sequence[float | None] | None = None,
    dist: Dist | None = None,
) -> None:
    """PPO: turn-level GAE per episode. The prompt shows the step number, so the step limit is part of the
    state and a truncated episode's last turn is terminal like any other (no bootstrap past it), unless
    ``last_values`` gives V(s_T) of the cut episodes (``cfg.bootstrap_truncated``; see ``episode_gae``). With
    ``dist`` (data-parallel) the advantages are whitened over every rank's turns."""
    i = 0
    for j, e in enumerate(episodes):
        n = len(e.turns)
        advantages, returns = episode_gae([t.reward for t in e.turns], [r.old_value for r in rows[i : i + n]],
                                          cfg.gamma, cfg.lam, None if last_values is None else last_values[j])
        for row, a, r in zip(rows[i : i + n], advantages, returns, strict=True):
            row.advantage, row.ret = a, r
        i += n
    if dist is not None and dist.world_size > 1:
        if cfg.normalize_advantages:
            shares = dist.gather([r.advantage for r in rows])
            if sum(len(s) for s in shares) > 1:
                adv = torch.tensor([a for s in shares for a in s])
                lo = sum(len(s) for s in shares[: dist.rank])
                whitened = masked_whiten(adv, torch.ones_like(adv))[lo : lo + len(rows)].tolist()
                for row, a in zip(rows, whitened, strict=True):
                    row.advantage = a
    elif cfg.normalize_advantages and len(rows) > 1:
        adv = torch.tensor([r.advantage for r in rows])
        for row, a in zip(rows, masked_whiten(adv, torch.ones_like(adv)).tolist(), strict=True):
            row.advantage = a


__all__ = ["TurnRow", "collate", "grpo_advantages", "ppo_advantages", "response_window", "turn_rows"]
