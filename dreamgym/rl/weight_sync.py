"""Rollouts from an inference server, with weight sync (``RLConfig.rollout_server``).

With a rollout server the trainer keeps its own copy of the policy for the update, the evaluations and the
checkpoints, and generates the training rollouts through the ``openai`` backend
(:class:`~dreamgym.llm.openai_backend.OpenAILLM`, same prompts, stop string, temperature and per-prompt seeds
as in process). The server's per-token log-probs are the behaviour log-probs of the importance ratio. After
every update (and once before the first rollout, so a resumed run or a server started from another checkpoint
serves the trainer's weights) rank 0 saves the weights as safetensors to ``RUN/sync/step_K/`` and tells the
server to load them (:meth:`WeightSync.push`); the new version is broadcast to every rank.

How the server is told (``RolloutServer.sync``):

* ``dreamgym`` (``dreamgym serve --api-key-env VAR``): ``POST /v1/load_weights {"path": DIR}`` with the Bearer
  key; the answer names the new ``weight_version``, which every later completion reports.
* ``sglang``: ``POST /update_weights_from_disk {"model_path": DIR, "weight_version": "N"}`` (the server root,
  without ``/v1``); the answer is ``{"success": bool, "message": ...}``; the served version is read back from
  ``GET /get_model_info`` (``weight_version``), since SGLang's OpenAI responses do not carry it. Written against
  SGLang's native-API docs (0.5.x), not run here.
* ``vllm_lora``: ``POST /v1/load_lora_adapter {"lora_name": "MODEL-vN", "lora_path": DIR}`` (vLLM with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); requests then name the adapter ``MODEL-vN``. It serves LoRA
  adapters only, and the trainer updates every weight, so an RL config refuses it; :func:`push_request` builds
  the request for an engine that trains adapters. Written against vLLM's LoRA docs (0.10), not run here.

The stale-policy guard (:meth:`WeightSync.check`): a rollout any of whose turns was generated under an older
weight version than the last push returned is refused with a one-line :class:`StaleRollout` error (a server
restarted from old weights, a lost reload): training on it would take the server's old policy for the
trainer's. It is an error, not a counted drop, because dropping episodes would break GRPO's groups and the
real-transition count, and a stale server stays stale for every later rollout. In-process rollouts
(no ``rollout_server``) go through the same object with ``push`` and ``check`` doing nothing.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dreamgym.agent.policy import LLMPolicy
from dreamgym.rl.distributed import Dist
from dreamgym.rl.rollout import Episode

SyncKind = Literal["dreamgym", "sglang", "vllm_lora"]


class RolloutServer(BaseModel):
    """Where training rollouts are generated (an OpenAI-compatible server) and how it gets new weights."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    base_url: str = Field(description="the OpenAI-compatible root, e.g. http://127.0.0.1:8000/v1")
    model: str = Field(description="the served model name requests send")
    api_key_env: str = Field(default="DREAMGYM_SERVE_KEY", description="env var holding the server's API key")
    sync: SyncKind = Field(default="dreamgym", description="how the server loads new weights (module docstring)")
    timeout_s: float = Field(default=300.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    concurrency: int = Field(default=32, ge=1, description="requests in flight (the server batches them)")


class StaleRollout(RuntimeError):
    """A rollout generated under older weights than the trainer pushed last (one-line message)."""


def push_request(server: RolloutServer, weights_dir: str, version: int) -> tuple[str, dict[str, Any]]:
    """The URL and JSON body that tell ``server`` to serve ``weights_dir`` as ``version``."""
    root = server.base_url.rstrip("/")
    if server.sync == "dreamgym":
        return f"{root}/load_weights", {"path": weights_dir, "version": version}
    if server.sync == "sglang":
        return f"{root.removesuffix('/v1')}/update_weights_from_disk", {"model_path": weights_dir,
                                                                         "weight_version": str(version)}
    return f"{root}/load_lora_adapter", {"lora_name": f"{server.model}-v{version}", "lora_path": weights_dir}


class WeightSync:
    """The policy that generates the training rollouts and, with a server, keeps its weights the trainer's."""

    def __init__(self, policy: LLMPolicy, server: RolloutServer | None = None, sync_dir: Path | None = None,
                 dist: Dist | None = None) -> None:
        self.policy, self.server, self.dist = policy, server, dist or Dist()
        self.sync_dir = sync_dir
        self.version: int | None = None  # what the last push made the server serve
        self.actor = policy
        self._pushes = 0
        if server is not None:
            from dreamgym.llm.base import LLMConfig
            from dreamgym.llm.openai_backend import OpenAILLM

            llm = OpenAILLM(LLMConfig(backend="openai", model=server.model, base_url=server.base_url,
                                      api_key_env=server.api_key_env, timeout_s=server.timeout_s,
                                      max_retries=server.max_retries, concurrency=server.concurrency))
            self.actor = LLMPolicy(llm, policy.cfg)

    def push(self) -> dict[str, Any]:
        """Save the trainer's weights and have the server serve them (rank 0; every rank learns the version);
        returns the metrics ``sync_s`` and ``weight_version`` ({} in process)."""
        if self.server is None:
            return {}
        t0 = time.perf_counter()
        version = self.dist.broadcast(self._push() if self.dist.is_main else None)
        self.version = int(version)
        return {"sync_s": time.perf_counter() - t0, "weight_version": self.version}

    def _push(self) -> int:
        import httpx

        assert self.server is not None and self.sync_dir is not None
        llm: Any = self.policy.llm
        self._pushes += 1
        target = self.sync_dir / f"step_{self._pushes}"
        if target.exists():
            shutil.rmtree(target)
        llm.model.save_pretrained(target, safe_serialization=True)
        if self.server.sync != "dreamgym":  # engines that load a model dir read its tokenizer too
            llm.tokenizer.save_pretrained(target)
        served = self.served_version()
        version = (served if served is not None else self.version or 0) + 1
        url, body = push_request(self.server, str(target.resolve()), version)
        key = os.environ.get(self.server.api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            r = httpx.post(url, json=body, headers=headers, timeout=self.server.timeout_s)
        except httpx.HTTPError as e:
            raise RuntimeError(f"weight sync: {url}: {type(e).__name__}: {e}") from None
        answer = _json(r)
        if r.status_code != 200 or answer.get("success") is False:
            message = answer.get("error", {}).get("message") if isinstance(answer.get("error"), dict) else None
            raise RuntimeError(f"weight sync: {url} answered HTTP {r.status_code}: "
                               f"{message or answer.get('message') or r.text[:200]}")
        if self.server.sync == "dreamgym":
            version = int(answer["weight_version"])
        for old in self.sync_dir.glob("step_*"):  # the server has read them: only the served weights stay
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
        return version

    def served_version(self) -> int | None:
        """The version the server says it serves (``dreamgym``: ``GET /stats``; ``sglang``: ``GET
        /get_model_info``); None when it does not say or cannot be asked."""
        import httpx

        assert self.server is not None
        root = self.server.base_url.rstrip("/")
        url = {"dreamgym": f"{root.removesuffix('/v1')}/stats", "sglang": f"{root.removesuffix('/v1')}/get_model_info"}
        if self.server.sync not in url:
            return None
        key = os.environ.get(self.server.api_key_env)
        try:
            r = httpx.get(url[self.server.sync], headers={"Authorization": f"Bearer {key}"} if key else {},
                          timeout=self.server.timeout_s)
        except httpx.HTTPError:
            return None
        v = _json(r).get("weight_version")
        return int(v) if isinstance(v, int) or (isinstance(v, str) and v.isdigit()) else None

    def check(self, episodes: list[Episode], iteration: int) -> None:
        """Refuse (:class:`StaleRollout`) a rollout generated under older weights than the last push."""
        if self.server is None or self.version is None:
            return
        versions = {t.weight_version for e in episodes for t in e.turns}
        reported = {v for v in versions if v is not None}
        if not reported and versions:  # a server whose completions do not say (SGLang): ask it
            served = self.served_version()
            reported = {served} if served is not None else set()
        if reported and min(reported) < self.version:
            raise StaleRollout(
                f"iteration {iteration}: rollout generated under weight version {min(reported)}, the trainer pushed "
                f"version {self.version} to {self.server.base_url} (was the server restarted or reloaded by "
                "someone else?); refusing to train on a stale policy")

    def close(self) -> None:
        if self.actor is not self.policy:
            self.actor.llm.close()  # type: ignore[attr-defined]


def _json(r: Any) -> dict[str, Any]:
    try:
        body = r.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


__all__ = ["RolloutServer", "StaleRollout", "WeightSync", "push_request"]
