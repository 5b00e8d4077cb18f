"""The backend an :class:`~dreamgym.llm.base.LLMConfig` names (kept apart from ``base``, which the backends
import)."""

from __future__ import annotations

from dreamgym.llm.base import LLM, LLMConfig


def load_llm(cfg: LLMConfig) -> LLM:
    """Build the backend named by ``cfg.backend``."""
    if cfg.backend == "hf":
        from dreamgym.llm.hf import HFLLM

        return HFLLM.from_pretrained(cfg.model, device=cfg.device, dtype=cfg.dtype, max_batch_size=cfg.max_batch_size)
    from dreamgym.llm.openai_backend import OpenAILLM

    return OpenAILLM(cfg)
