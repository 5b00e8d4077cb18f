"""PPO's value model: a separate critic, V(s_t) read at the last prompt token of turn t.

The critic is a copy of the policy's transformer trunk (the usual LLM-PPO choice, as in verl: same
architecture, initialised from the policy) with a scalar head, zero-initialised so that every value starts at
0 and the first advantages are the plain returns. It sees the turn's prompt only (task, history, current
state), which is the state the policy is about to act in.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import Tensor, nn


class Critic(nn.Module):
    def __init__(self, trunk: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.trunk = trunk
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy(cls, policy_model: Any) -> Critic:
        """A critic whose trunk is a copy of ``policy_model``'s base transformer (no LM head)."""
        trunk = copy.deepcopy(policy_model.base_model)
        trunk.train()
        return cls(trunk, int(policy_model.config.hidden_size))

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """One value per row, at its last real token ([B, L] right- or left-padded ids -> [B])."""
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self.trunk(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        states = hidden.last_hidden_state  # [B, L, H]
        # last real token = first real token (argmax of the mask) + number of real tokens − 1 (max position id)
        last = attention_mask.long().argmax(dim=-1) + position_ids.max(dim=-1).values
        picked = states[torch.arange(states.shape[0], device=states.device), last]
        return self.value_head(picked).squeeze(-1).float()

    def save(self, path: str | os.PathLike[str]) -> None:
        save_model(self, str(Path(path)))

    def load(self, path: str | os.PathLike[str]) -> None:
        load_model(self, str(Path(path)))


__all__ = ["Critic"]
