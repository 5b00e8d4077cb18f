"""The ``openai`` backend: any OpenAI-compatible server (vLLM, SGLang, Ollama, OpenAI, ``dreamgym serve``).

String prompts and token ids go to ``/v1/completions`` (token ids as the prompt, which vLLM, SGLang and
``dreamgym serve`` accept), chat message lists to ``/v1/chat/completions``. One request per prompt, sent
concurrently from a thread pool of ``concurrency`` workers; the server batches them. Generated token ids
come from the ``return_token_ids`` extension (recent vLLM, ``dreamgym serve``); a server that does not
return them leaves ``Completion.token_ids`` empty, with a warning. Log-probs are whatever the server computes:
``dreamgym serve`` follows :mod:`dreamgym.llm.base`; vLLM returns the model's raw (T = 1) log-probs unless it
runs with ``--logprobs-mode processed_logprobs``, so RL against vLLM should recompute them or set that mode.

Retries: our own loop, not the client's, because the client's backoff base (0.5 s) is a module constant and
we want it configurable (tests use milliseconds, rate-limited providers want seconds). It retries what the
client would (connection errors, timeouts, 408/409/429/5xx) with exponential backoff, then raises
:class:`LLMError` in one line. The API key comes only from the environment variable ``cfg.api_key_env``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import openai

from dreamgym.llm.base import Completion, LLMConfig, LLMError, Prompt, SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRY_STATUS = {408, 409, 429}


class OpenAILLM:
    """Generation through an OpenAI-compatible HTTP endpoint; see :mod:`dreamgym.llm.base` for semantics."""

    def __init__(self, cfg: LLMConfig) -> None:
        self.cfg = cfg
        self.client = openai.OpenAI(
            base_url=cfg.base_url,
            api_key=os.environ.get(cfg.api_key_env) or "EMPTY",  # local servers need no key
            timeout=cfg.timeout_s,
            max_retries=0,
        )
        self.tokenizer: Any = None
        if cfg.tokenizer:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
        self._pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="dreamgym-openai")
        self._warned_no_ids = False

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAILLM(model={self.cfg.model!r}, base_url={self.cfg.base_url!r})"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    # ------------------------------------------------------------------------------------ public API

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        return self._map(list(prompts), params)

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
        return self._map([list(p) for p in prompt_ids], params)

    # ------------------------------------------------------------------------------------- requests

    def _map(self, prompts: list[Prompt | list[int]], params: SamplingParams) -> list[Completion]:
        seeded = [params if params.seed is None else replace(params, seed=params.seed + i) for i in range(len(prompts))]
        return list(self._pool.map(self._one, prompts, seeded))

    def _one(self, prompt: Prompt | list[int], params: SamplingParams) -> Completion:
        common: dict[str, Any] = {
            "model": self.cfg.model,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": list(params.stop) or None,
            "seed": params.seed,
            "extra_body": {"return_token_ids": True} if self.cfg.return_token_ids else None,
        }
        if params.choices is not None:  # vLLM's and SGLang's guided choice
            common["extra_body"] = {**(common["extra_body"] or {}), "guided_choice": list(params.choices)}
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            chat = self._retrying(
                lambda: self.client.chat.completions.create(
                    messages=prompt,  # type: ignore[arg-type]
                    logprobs=params.logprobs or None,
                    **common,
                )
            )
            choice: Any = chat.choices[0]
            text = choice.message.content or ""
            content = choice.logprobs.content if params.logprobs and choice.logprobs else None
            logprobs = [t.logprob for t in content] if content is not None else None
            prompt_ids = getattr(choice, "prompt_token_ids", None) or getattr(chat, "prompt_token_ids", None)
            version = getattr(chat, "weight_version", None)
        else:
            done = self._retrying(
                lambda: self.client.completions.create(
                    prompt=prompt,  # type: ignore[arg-type]
                    logprobs=1 if params.logprobs else None,
                    **common,
                )
            )
            choice = done.choices[0]
            text = choice.text
            logprobs = list(choice.logprobs.token_logprobs) if params.logprobs and choice.logprobs else None
            prompt_ids = getattr(choice, "prompt_token_ids", None)
            version = getattr(done, "weight_version", None)
        if params.logprobs and logprobs is None:
            raise LLMError(f"{self.cfg.base_url}: the server returned no logprobs although they were requested")
        token_ids = getattr(choice, "token_ids", None)
        if token_ids is None:
            token_ids = []
            if not self._warned_no_ids:
                self._warned_no_ids = True
                log.warning("%s returned no token ids; Completion.token_ids will be empty", self.cfg.base_url)
        return Completion(
            text=text,
            token_ids=list(token_ids),
            logprobs=logprobs,
            prompt_ids=list(prompt_ids) if prompt_ids is not None else None,
            finish_reason="length" if choice.finish_reason == "length" else "stop",
            weight_version=version if isinstance(version, int) else None,  # dreamgym serve: the weights' version
        )

    def _retrying(self, call: Callable[[], T]) -> T:
        attempts = self.cfg.max_retries + 1
        last = ""
        for attempt in range(attempts):
            try:
                return call()
            except openai.APIStatusError as e:
                if e.status_code not in RETRY_STATUS and e.status_code < 500:
                    hint = f" (is ${self.cfg.api_key_env} set?)" if e.status_code == 401 else ""
                    raise LLMError(f"{self.cfg.base_url}: HTTP {e.status_code}: {_message(e)}{hint}") from None
                last = f"HTTP {e.status_code}: {_message(e)}"
            except openai.APIConnectionError as e:  # includes APITimeoutError
                last = f"{type(e).__name__}: {e}"
            if attempt + 1 < attempts:
                delay = self.cfg.retry_backoff_s * 2**attempt
                log.info("%s: %s; retry %d/%d in %.2fs", self.cfg.base_url, last, attempt + 1, attempts - 1, delay)
                time.sleep(delay)
        raise LLMError(f"{self.cfg.base_url}: failed after {attempts} attempts: {last}")


def _message(e: openai.APIStatusError) -> str:
    """The server's own error message (OpenAI's ``{"error": {"message": ...}}`` or vLLM's ``{"message": ...}``)."""
    body = e.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"]).splitlines()[0]
    return str(e.message).splitlines()[0]
