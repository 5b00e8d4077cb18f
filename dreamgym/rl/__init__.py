"""Policy optimisation: GRPO / PPO advantages and token-level losses (rollout and trainer build on these)."""

from dreamgym.rl.advantages import broadcast_turn_values, episode_gae, gae, group_advantages, reward_variance
from dreamgym.rl.losses import (
    AggMode,
    KLKind,
    agg_loss,
    check_kl_loss,
    dropout_off,
    entropy_from_logits,
    kl_penalty,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    policy_loss,
    sequence_logprobs,
    token_logprobs,
    value_loss,
)

__all__ = [
    "AggMode",
    "KLKind",
    "agg_loss",
    "broadcast_turn_values",
    "check_kl_loss",
    "dropout_off",
    "entropy_from_logits",
    "episode_gae",
    "gae",
    "group_advantages",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "reward_variance",
    "sequence_logprobs",
    "token_logprobs",
    "value_loss",
]
