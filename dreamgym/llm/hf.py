"""The ``hf`` backend: a local transformers causal LM, batched with left padding and a KV cache.

Prompts are sorted by length and cut into batches of at most ``max_batch_size`` rows, each decoded by a
:class:`~dreamgym.llm.decode.DecodeBatch` (our own loop; see there for why not ``model.generate``).

``HFLLM.model`` and ``HFLLM.tokenizer`` are the live objects: RL trains the same model in-process.
One ``HFLLM`` is not thread-safe; ``dreamgym serve`` calls it from a single worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dreamgym.llm.base import Completion, Prompt, SamplingParams
from dreamgym.llm.decode import DecodeBatch

DTYPES = ("float32", "bfloat16", "float16")


class HFLLM:
    """Generation with a local Hugging Face model; see :mod:`dreamgym.llm.base` for the semantics."""

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 64) -> None:
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has neither a pad nor an EOS token; cannot left-pad a batch")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        eos = model.generation_config.eos_token_id
        eos = tokenizer.eos_token_id if eos is None else eos
        self.eos_ids: set[int] = set(eos) if isinstance(eos, list) else ({eos} if eos is not None else set())
        self.pad_id: int = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.max_length: int | None = getattr(model.config, "max_position_embeddings", None)

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike[str], device: str = "cpu", dtype: str = "float32", max_batch_size: int = 64
    ) -> HFLLM:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        from dreamgym.llm.pretrained import resolve_model

        path = resolve_model(str(path))
        tokenizer = AutoTokenizer.from_pretrained(path)
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        model.to(device).eval()
        return cls(model, tokenizer, max_batch_size=max_batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------------------------ public API

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a raw prompt (with the tokenizer's special tokens) or of chat messages (through the
        chat template, with the generation prompt)."""
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt).input_ids)
        if not isinstance(prompt, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        ):
            raise ValueError("a chat prompt must be a list of {'role': str, 'content': str} messages")
        if self.tokenizer.chat_template is None:
            raise ValueError("this tokenizer has no chat template; pass raw string prompts")
        text = self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        return self.generate_ids([self.encode(p) for p in prompts], params)

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
        seeded = [params if params.seed is None else replace(params, seed=params.seed + i) for i in range(len(prompt_ids))]
        return self.generate_rows(prompt_ids, seeded)

    def generate_rows(self, prompt_ids: Sequence[list[int]], params: Sequence[SamplingParams]) -> list[Completion]:
        """Each row with its own parameters (its ``seed`` used as is). Rows are grouped by prompt length into
        batches of at most ``max_batch_size``; results come back in input order."""
        if len(prompt_ids) != len(params):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(params)} sampling params")
        for ids, p in zip(prompt_ids, params, strict=True):
            self.check_prompt(ids, p)
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        out: list[Completion | None] = [None] * len(prompt_ids)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            done = self._decode([list(prompt_ids[i]) for i in chunk], [params[i] for i in chunk])
            for i, completion in zip(chunk, done, strict=True):
                out[i] = completion
        return [c for c in out if c is not None]

    # ---------------------------------------------------------------------------------- decode loop

    def check_prompt(self, ids: list[int], p: SamplingParams) -> None:
        """Raise ValueError for an empty prompt, an id outside the vocabulary, or one too long for the context."""
        if not ids:
            raise ValueError("empty prompt")
        vocab = self.model.get_input_embeddings().num_embeddings
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token id out of range [0, {vocab})")
        if self.max_length is not None and len(ids) + p.max_new_tokens > self.max_length:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({p.max_new_tokens}) exceeds the model's "
                f"context of {self.max_length} tokens"
            )

    @torch.inference_mode()
    def _decode(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Completion]:
        was_training = self.model.training  # RL may hand us a model in train mode
        if was_training:
            self.model.eval()
        try:
            batch = self.new_batch()
            rows = batch.add(prompts, params)
            while batch.active:
                batch.step()
            return [r.completion(self.tokenizer) for r in rows]
        finally:
            if was_training:
                self.model.train()

    def new_batch(self) -> DecodeBatch:
        """An empty running batch on this model (``dreamgym serve`` keeps one and feeds it requests)."""
        return DecodeBatch(self.model, self.tokenizer, self.eos_ids, self.pad_id)
