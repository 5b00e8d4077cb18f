"""The one generation interface every DreamGym model speaks (policy, experience model, teacher, task generator).

``LLM.generate(prompts, params)`` takes raw strings or chat message lists; ``LLM.generate_ids`` takes token
ids and returns token ids, so RL never re-tokenises what the policy generated. Two backends implement it:
``hf`` (a local transformers model, :mod:`dreamgym.llm.hf`) and ``openai`` (any OpenAI-compatible server:
vLLM, SGLang, Ollama, OpenAI, or ``dreamgym serve``; :mod:`dreamgym.llm.openai_backend`).

Semantics shared by the backends:

* ``temperature == 0`` is greedy decoding; ``top_p`` applies only when sampling.
* Prompt ``i`` of a call is sampled with seed ``seed + i`` (when ``seed`` is set), so a prompt's sample does
  not depend on which other prompts share its batch, and repeated prompts (a GRPO group) still differ.
* ``Completion.logprobs[j]`` is ``log_softmax(logits / T)[token_ids[j]]`` at generated position ``j``, with
  ``T = temperature`` when sampling and ``T = 1`` when greedy; it is taken *before* top-p truncation (so it is
  exactly the sampling distribution when ``top_p == 1``).
* A stop string ends the generation: ``text`` is cut just before it (the stop string is not included) and
  ``token_ids`` end with the token that completed it. An EOS token ends it too and is the last token id (it
  is not in ``text``). Both give ``finish_reason == "stop"``; running out of ``max_new_tokens`` gives
  ``"length"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

ChatMessages: TypeAlias = list[dict[str, str]]
Prompt: TypeAlias = str | ChatMessages
FinishReason: TypeAlias = Literal["stop", "length"]


class LLMError(RuntimeError):
    """A backend failed (server down after all retries, a refused request, ...). The message is one line."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop: tuple[str, ...] | list[str] = ()
    seed: int | None = None
    logprobs: bool = False
    # guided choice (vLLM's ``guided_choice``): the completion is one of these strings, token by token the
    # argmax (greedy) or a sample of the distribution renormalised over the tokens that continue one of them
    # (``logprobs`` are of that distribution). They must be prefix-free (e.g. each ends with a closing tag): a
    # complete one ends the row with ``finish_reason == "stop"``. The ``hf`` backend runs a row to the end of its
    # choice even past ``max_new_tokens`` (a cut choice is no admissible action); a server may cut it.
    choices: tuple[str, ...] | list[str] | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        object.__setattr__(self, "stop", tuple(self.stop))  # a tuple keeps the frozen dataclass hashable
        if self.choices is not None:
            if not self.choices or any(not c for c in self.choices):
                raise ValueError("choices must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choices", tuple(self.choices))


@dataclass
class Completion:
    text: str
    token_ids: list[int]  # generated ids (after stop truncation; EOS included when it ended the generation)
    logprobs: list[float] | None = None  # one per token id, see the module docstring; None unless asked
    prompt_ids: list[int] | None = None  # None when a server did not return them
    finish_reason: FinishReason = "length"
    weight_version: int | None = None  # the served weights that generated it (dreamgym serve's load_weights)
    # guided choice (``hf`` backend): per generated token, the token ids it was chosen among (the masked
    # distribution ``logprobs`` are of; an empty list: the whole vocabulary). RL's loss scores each token under
    # the same mask (``dreamgym.rl.losses.restrict_logprobs``). None without choices or from a server.
    allowed_ids: list[list[int]] | None = None


@runtime_checkable
class LLM(Protocol):
    """What every backend offers. ``tokenizer`` is a Hugging Face tokenizer, or None where none is known."""

    tokenizer: object | None

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]: ...

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]: ...


class LLMConfig(BaseModel):
    """Which model to load and how. API keys are read from the environment variable ``api_key_env`` only."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    backend: Literal["hf", "openai"] = "hf"
    model: str = Field(description="hf: a model directory or hub name; openai: the served model name")
    base_url: str | None = Field(default=None, description="openai: e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = "OPENAI_API_KEY"
    tokenizer: str | None = Field(default=None, description="openai: an optional local tokenizer for prompts")
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_batch_size: int = Field(default=64, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    retry_backoff_s: float = Field(default=0.5, ge=0, description="first retry delay; doubles each retry")
    concurrency: int = Field(default=32, ge=1)
    return_token_ids: bool = Field(
        default=True, description="openai: ask for generated token ids (vLLM, dreamgym serve); False for OpenAI"
    )
