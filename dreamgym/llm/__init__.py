"""One generation interface for every DreamGym model: local Hugging Face models (``hf``) and
OpenAI-compatible servers (``openai``), chosen by :class:`LLMConfig`. See :mod:`dreamgym.llm.base`."""

from dreamgym.llm.base import (
    LLM,
    ChatMessages,
    Completion,
    LLMConfig,
    LLMError,
    Prompt,
    SamplingParams,
)
from dreamgym.llm.load import load_llm

__all__ = ["LLM", "ChatMessages", "Completion", "LLMConfig", "LLMError", "Prompt", "SamplingParams", "load_llm"]
