"""PPO's value model: a separate critic, V(s_t) read at the last prompt token of turn t.

The critic is a copy of the policy's transformer trunk (the usual LLM-PPO choice, as in verl: same
architecture, initialised from the policy) with a scalar head, zero-initialised so that every value starts at
0 and the first advantages are the plain returns. It sees the turn's prompt only (task, history, current
state), which is the state the policy is about to act in. It is kept in eval mode (dropout off; gradients
still flow), so that its rollout-time values and the values its update starts from agree.

Horizon. The prompt shows the step number but not the step limit, so the values a critic learns near the end of
an episode hold for the ``max_steps`` it was trained with; :func:`check_horizon` warns when a run continues
from one trained with another.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import Tensor, nn

log = logging.getLogger(__name__)


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
        # eval: dropout off, so values at rollout time and in the update come from the same function
        like = next(policy_model.parameters())  # the value head joins the trunk's device and dtype
        return cls(trunk, int(policy_model.config.hidden_size)).to(like.device, like.dtype).eval()

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


@torch.no_grad()
def truncated_values(critic: Critic, policy: Any, episodes: Sequence[Any], pad_id: int,
                     micro_batch_size: int = 32) -> list[float | None]:
    """V(s_T) of each episode cut by the step limit at a non-terminal state (its ``final_obs``, prompted as the
    policy would have seen it), None for the episodes that ended in a terminal state."""
    from dreamgym.agent.policy import build_agent_prompt

    cut = [i for i, e in enumerate(episodes) if e.final_obs is not None]
    prompts = [policy.llm.encode(build_agent_prompt(episodes[i].final_obs, policy.cfg)) for i in cut]
    out: list[float | None] = [None] * len(episodes)
    restore_eval = critic.training
    critic.eval()
    for start in range(0, len(cut), micro_batch_size):
        chunk = prompts[start : start + micro_batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, p in enumerate(chunk):
            ids[row, : len(p)], attn[row, : len(p)] = torch.tensor(p), 1
        device = next(critic.parameters()).device
        for i, v in zip(cut[start : start + micro_batch_size], critic(ids.to(device), attn.to(device)).tolist(),
                        strict=True):
            out[i] = float(v)
    critic.train(restore_eval)
    return out


def check_horizon(max_steps: int, source: str | os.PathLike[str] | None, what: str) -> int | None:
    """Warn when the run at ``source`` (its ``config.yaml``) was trained with another ``max_steps``; returns that.

    ``what`` names what carries the other horizon over (a resumed critic, an initial policy). The prompt shows
    the step number but not the limit, so values (and a policy's end-of-episode behaviour) learned for one
    limit are off for another: e.g. a PPO critic trained in the dream with ``max_steps=6`` has learned that the
    6th step ends the episode.
    """
    if source is None or not (Path(source) / "config.yaml").is_file():
        return None
    import yaml

    try:
        saved = yaml.safe_load((Path(source) / "config.yaml").read_text()).get("max_steps")
    except (yaml.YAMLError, AttributeError, OSError):
        return None
    if isinstance(saved, int) and saved != max_steps:
        log.warning("%s was trained with max_steps=%d but this run uses max_steps=%d: what it learned near the step "
                    "limit (a critic's values, the policy's last steps) holds for the other horizon "
                    "(bootstrap_truncated=True stops treating the limit as terminal)", what, saved, max_steps)
        return saved
    return None


__all__ = ["Critic", "check_horizon", "truncated_values"]
