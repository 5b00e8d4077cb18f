"""Offline baselines for the LLM policy: behaviour cloning (SFT) and DPO on success-vs-failure pairs."""

from dreamgym.baselines.dpo import (
    DPOTrainConfig,
    PreferencePair,
    preference_margin,
    preference_pairs,
    train_dpo,
)
from dreamgym.baselines.sft import agent_observations, bc_examples, on_path, read_data, train_bc

__all__ = [
    "DPOTrainConfig",
    "PreferencePair",
    "agent_observations",
    "bc_examples",
    "on_path",
    "preference_margin",
    "preference_pairs",
    "read_data",
    "train_bc",
    "train_dpo",
]
