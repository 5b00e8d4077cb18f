"""Advantage estimators: GRPO's group-relative outcome advantage and PPO's GAE.

Granularity in dreamgym. A rollout is a list of *turns*; each turn is one policy response (its tokens are
the only trained ones) to a prompt that holds the task, the history and the current abstract state.
Rewards arrive per turn (the outcome reward at the last turn, plus an optional invalid-action penalty on
any turn), so both estimators give one advantage per turn, which the trainer then broadcasts over that
turn's response tokens:

* GRPO: ``group_advantages`` on the episode returns of the G episodes of one task (a GRPO group); every
  turn of an episode gets its episode's advantage (the verl-agent GRPO baseline); with GiGPO's step weight,
  plus ``step_advantages``: the turn's discounted return against those of the group's turns taken in the same
  state.
* PPO: ``gae`` over an episode's turns, where V(s_t) is the critic's value at the last prompt token of turn
  t (the state the policy is about to act in); ``broadcast_turn_values`` spreads the per-turn advantages
  onto the response tokens of a packed multi-turn row.

``reward_variance`` (the paper's curriculum signal V_τ) lives here because it is the same group statistic
as GRPO's baseline; ``dreamgym.curriculum`` imports it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

GroupIds = Tensor | Sequence[Hashable]


def _group_index(group_ids: GroupIds, n: int) -> tuple[Tensor, list[Hashable]]:
    """Map arbitrary group ids to ``inverse[i] in 0..K-1`` and return the K distinct ids in first-seen order."""
    if isinstance(group_ids, Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D, got shape {tuple(group_ids.shape)}")
        ids: list[Hashable] = group_ids.tolist()
    else:
        ids = list(group_ids)
    if len(ids) != n:
        raise ValueError(f"got {n} rewards but {len(ids)} group ids")
    keys = list(dict.fromkeys(ids))
    position = {key: k for k, key in enumerate(keys)}
    inverse = torch.tensor([position[i] for i in ids], dtype=torch.long)
    return inverse, keys


def _check_rewards(rewards: Tensor) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (one return per episode), got shape {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise ValueError(f"rewards must be finite, got {rewards.tolist()}")


def _group_moments(
    rewards: Tensor, group_ids: GroupIds
) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Hashable]]:
    """Per-group ``count``, ``mean`` and ``sum of squared deviations`` ([K], float64), ``inverse`` ([N]) and keys."""
    _check_rewards(rewards)
    inverse, keys = _group_index(group_ids, rewards.numel())
    inverse = inverse.to(rewards.device)
    r = rewards.double()  # group statistics in float64: groups are small and eps-sized stds matter
    zeros = torch.zeros(len(keys), dtype=torch.float64, device=r.device)
    count = zeros.index_add(0, inverse, torch.ones_like(r))
    mean = zeros.index_add(0, inverse, r) / count
    sq_dev = zeros.index_add(0, inverse, (r - mean[inverse]) ** 2)
    return count, mean, sq_dev, inverse, keys


@torch.no_grad()
def group_advantages(
    rewards: Tensor, group_ids: GroupIds, normalize_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO outcome advantage, one per episode.

    A_i = (r_i − mean_g) / (std_g + eps)   (``normalize_std=True``, GRPO / verl / TRL)
    A_i =  r_i − mean_g                    (``normalize_std=False``, Dr.GRPO: no difficulty reweighting)

    ``std_g`` is the *sample* (Bessel-corrected, n−1) standard deviation, as ``torch.std`` in verl and TRL,
    so ``[1, 0, 1, 0]`` gives ±0.866. A group of one episode has no baseline and gets A = 0 (verl instead
    returns the raw reward there). A group whose rewards are all equal gets A = 0 either way.

    rewards: [N] episode returns (outcome reward plus any per-turn penalties).
    group_ids: [N] task ids (any hashables, or an integer tensor); equal ids form one GRPO group.
    """
    count, mean, sq_dev, inverse, _ = _group_moments(rewards, group_ids)
    advantages = rewards.double() - mean[inverse]
    if normalize_std:
        sample_std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
        advantages = advantages / (sample_std[inverse] + eps)
    advantages = torch.where(count[inverse] > 1, advantages, torch.zeros_like(advantages))
    return advantages.to(rewards.dtype)


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """Per step, the discounted return from that step on: G_t = r_t + γ G_{t+1}, G_T = 0."""
    out = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


@torch.no_grad()
def step_advantages(
    rewards: Sequence[Sequence[float]], anchors: Sequence[Sequence[Hashable]], gamma: float,
    normalize_std: bool = True,
) -> tuple[list[float], dict[str, float]]:
    """GiGPO's step-level advantage (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent
    Training"), one per turn of the given episodes, flattened episode by episode.

    The turns whose anchor (e.g. the group and the exact state acted in) is equal form a *step group*; a turn's
    discounted return from its step, G_t = Σ_k γ^k r_{t+k}, is compared with its step group's returns exactly as
    :func:`group_advantages` compares episode returns, so a step group of one turn, or one whose returns are all
    equal, gives 0. The step term credits the action taken in a state that several episodes of the group
    reached (which result to open, which option to pick) where the episode term gives every turn the same credit.

    rewards: per episode, its per-turn rewards (what RL optimises); anchors: per episode, one hashable per turn.
    Returns the advantages and ``{"step_groups": groups of ≥ 2 turns, "step_grouped_share": the share of turns
    in one}``.
    """
    if len(rewards) != len(anchors) or any(len(r) != len(a) for r, a in zip(rewards, anchors, strict=False)):
        raise ValueError("rewards and anchors must have one entry per turn of each episode")
    flat_returns = [g for r in rewards for g in discounted_returns(r, gamma)]
    flat_anchors = [a for per in anchors for a in per]
    if not flat_returns:
        return [], {"step_groups": 0.0, "step_grouped_share": 0.0}
    returns = torch.tensor(flat_returns, dtype=torch.float64)
    advantages = group_advantages(returns, flat_anchors, normalize_std=normalize_std)
    sizes = Counter(flat_anchors)
    grouped = sum(n for n in sizes.values() if n > 1)
    stats = {"step_groups": float(sum(n > 1 for n in sizes.values())), "step_grouped_share": grouped / len(flat_anchors)}
    return advantages.tolist(), stats


@torch.no_grad()
def reward_variance(rewards: Tensor, group_ids: GroupIds) -> dict[Hashable, float]:
    """The paper's curriculum signal per group (task): V_τ = (1/n) Σ_i (r_i − r̄)², the *population* variance.

    It is 0 for a task always solved or always failed and peaks at 0.25 for a 50/50 split of 0/1 rewards.
    Integer-tensor group ids come back as Python ints.
    """
    count, _, sq_dev, _, keys = _group_moments(rewards, group_ids)
    variance = sq_dev / count
    return {key: float(v) for key, v in zip(keys, variance.tolist(), strict=True)}


@torch.no_grad()
def gae(rewards: Tensor, values: Tensor, dones: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over the last (time) axis.

    δ_t = r_t + γ (1 − d_t) V_{t+1} − V_t
    A_t = δ_t + γ λ (1 − d_t) A_{t+1},     A_T = 0
    R_t = A_t + V_t                          (the λ-return: the critic's regression target)

    rewards: [..., T] reward after step t (turn t in dreamgym).
    values:  [..., T+1] V(s_0..s_{T-1}) plus the bootstrap value V(s_T) of the state after the last step.
    dones:   [..., T] 1 where s_{t+1} is terminal (success, failure, purchase): no bootstrap across it and
             the recursion restarts, so several episodes may be concatenated along T.
    A *truncated* episode (step limit reached, not terminal) is passed with d_{T-1} = 0 and V_T = the critic's
    value of the state it was cut at, so its tail is bootstrapped. Truncation can therefore only be at the
    end of the sequence: call ``gae`` once per episode when episodes are cut by a step limit.
    Leading batch dimensions are vectorised (rows of equal length, no padding).
    """
    if values.shape[:-1] != rewards.shape[:-1] or values.shape[-1] != rewards.shape[-1] + 1:
        raise ValueError(
            f"values must be rewards' shape with one extra bootstrap step: rewards {tuple(rewards.shape)}, "
            f"values {tuple(values.shape)}"
        )
    if dones.shape != rewards.shape:
        raise ValueError(f"dones {tuple(dones.shape)} must match rewards {tuple(rewards.shape)}")
    not_done = 1.0 - dones.to(rewards.dtype)
    num_steps = rewards.shape[-1]
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(num_steps)):
        delta = rewards[..., t] + gamma * not_done[..., t] * values[..., t + 1] - values[..., t]
        last_gae = delta + gamma * lam * not_done[..., t] * last_gae
        advantages[..., t] = last_gae
    returns = advantages + values[..., :num_steps]
    return advantages, returns


def episode_gae(
    rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float, last_value: float | None = None
) -> tuple[list[float], list[float]]:
    """Turn-level GAE of one episode: per-turn advantages and λ-returns.

    ``values`` are V(s_0..s_{T-1}). ``last_value=None`` treats the end as terminal (V_T = 0): right for a
    success or failure, and for a step-limit cut too when the limit is part of the state (dreamgym's prompt shows
    the step number and every episode of a run has the same ``max_steps``). A float is V(s_T), the critic's
    value of the state the episode was cut at: the last target becomes r_{T-1} + γ V(s_T) (a truncated, not
    terminated, episode; ``RLConfig.bootstrap_truncated``).
    """
    n = len(rewards)
    if len(values) != n:
        raise ValueError(f"{n} rewards but {len(values)} values")
    bootstrap = 0.0 if last_value is None else float(last_value)
    dones = torch.zeros(n, dtype=torch.float64)
    if n and last_value is None:
        dones[-1] = 1.0
    advantages, returns = gae(torch.tensor(list(rewards), dtype=torch.float64),
                              torch.tensor([*values, bootstrap], dtype=torch.float64), dones, gamma, lam)
    return advantages.tolist(), returns.tolist()


def broadcast_turn_values(turn_values: Tensor, turn_ids: Tensor) -> Tensor:
    """Spread one value per turn onto that turn's response tokens: out[b, l] = turn_values[b, turn_ids[b, l]].

    turn_values: [B, K] a per-turn quantity (advantage, return) for the K turns packed into row b.
    turn_ids:    [B, L] long; the turn index of each *response* token, −1 on prompt, observation and padding
                 tokens (those get 0). With one turn per row (K = 1) this is ``turn_values * response_mask``.
    """
    if turn_values.dim() != 2 or turn_ids.dim() != 2 or turn_values.shape[0] != turn_ids.shape[0]:
        raise ValueError(
            f"expected turn_values [B, K] and turn_ids [B, L], got {tuple(turn_values.shape)} and "
            f"{tuple(turn_ids.shape)}"
        )
    if turn_ids.numel() > 0 and int(turn_ids.max()) >= turn_values.shape[1]:
        raise ValueError(f"turn_ids reach {int(turn_ids.max())} but only {turn_values.shape[1]} turn values")
    is_response = turn_ids >= 0
    gathered = turn_values.gather(1, turn_ids.clamp(min=0))
    return torch.where(is_response, gathered, torch.zeros_like(gathered))


__all__ = ["GroupIds", "broadcast_turn_values", "discounted_returns", "episode_gae", "gae", "group_advantages",
           "reward_variance", "step_advantages"]
