"""``dreamgym serve``: an OpenAI-compatible server (FastAPI + uvicorn) for a local Hugging Face model.

Endpoints: ``GET /v1/models``, ``POST /v1/completions`` (prompt: a string, a list of strings, token ids or a
list of token-id lists), ``POST /v1/chat/completions``, and ``GET /stats`` (batching counters). Concurrent
requests are batched continuously (:class:`~dreamgym.llm.batcher.Batcher`): each request becomes rows that
join the running decode batch between steps and leave it when done. Rows carry their own sampling parameters
(temperature, top-p, stop, seed, max tokens), so any mix of requests shares one forward pass; no grouping by
parameters is needed.

Extensions (the names vLLM uses): ``guided_choice: [str, ...]`` constrains the completion to one of them
(:class:`~dreamgym.llm.base.SamplingParams` ``choices``); request field ``return_token_ids: true`` adds ``token_ids`` (generated ids,
as in :class:`~dreamgym.llm.base.Completion`) and ``prompt_token_ids`` to each choice. Log-probs follow the
OpenAI formats (completions: ``logprobs.tokens/token_logprobs/text_offset``; chat: ``logprobs.content``);
values are those of :mod:`dreamgym.llm.base`, and ``top_logprobs`` is always empty (not computed).
Seeds: row ``j`` of a request (prompt-major, then ``n``) is sampled with ``seed + j``.

A request whose client disconnects is aborted, as vLLM does: its rows leave the batch before the next decode
step (``/stats`` counts them as ``rows_aborted``). A request may set a deadline, ``timeout`` in seconds (a
dreamgym extension; ``ServerLimits.request_timeout_s`` is the server's default), after which it is aborted
with a 408. A chat request without ``max_tokens`` gets ``ServerLimits.chat_max_tokens`` (256), capped by the
context left.

Bad requests (malformed JSON, missing fields, a body over ``max_body_bytes``, too long a prompt, too many
tokens, streaming) get a 4xx JSON error ``{"error": {"message", "type", "code"}}``; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from dreamgym.llm.base import Completion, SamplingParams
from dreamgym.llm.batcher import Batcher
from dreamgym.llm.hf import HFLLM

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    max_batch: int = 64  # rows in the running batch; also the most rows (prompts x n) one request may have
    max_tokens: int = 1024  # cap on a request's max_tokens
    max_prompt_tokens: int | None = None  # None: the model's context minus the request's max_tokens
    max_body_bytes: int = 1 << 20
    max_n: int = 16
    chat_max_tokens: int = 256  # a chat request's max_tokens when it gives none (then capped by the context)
    request_timeout_s: float | None = None  # default deadline of a request (a request's own "timeout" wins)
    poll_s: float = 0.2  # how often a waiting request checks that its client is still there


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


# ------------------------------------------------------------------------------------ request bodies


class _Request(BaseModel):
    # strict: "max_tokens": "5" is an error, as in OpenAI's API, not a silently coerced 5
    model_config = ConfigDict(extra="ignore", protected_namespaces=(), strict=True)

    model: str
    temperature: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    return_token_ids: bool = False
    guided_choice: list[str] | None = None  # vLLM's: the completion is one of these (SamplingParams.choices)
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # seconds; a dreamgym extension


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)


R = TypeVar("R", bound=BaseModel)


# ---------------------------------------------------------------------------------------------- app


class LoadWeightsRequest(BaseModel):
    """``POST /v1/load_weights`` (a dreamgym extension): serve the safetensors weights in ``path`` (a model dir
    as ``save_pretrained`` writes it) as ``version`` (default: the served one + 1)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    version: int | None = Field(default=None, ge=1)


def read_weights(path: str) -> dict[str, Any]:
    """The tensors of every ``*.safetensors`` file in the directory ``path`` (or of that one file)."""
    from pathlib import Path

    from safetensors.torch import load_file

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"{path}: no .safetensors weights there")
    weights: dict[str, Any] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except Exception as e:  # safetensors' own SafetensorError (a truncated or corrupt file) is no OSError
            raise ValueError(f"{f.name}: unreadable safetensors ({str(e).splitlines()[0]})") from None
    return weights


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


async def _read(request: Request, schema: type[R], limit: int) -> R:
    """The JSON body parsed into ``schema``; the body is read in chunks and refused past ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPError(413, f"request body exceeds the limit of {limit} bytes")
    try:
        return schema.model_validate_json(bytes(body))
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "body"
        raise HTTPError(400, f"{where}: {err['msg']}") from None


def _prompt_ids(llm: HFLLM, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
    """The token ids of each prompt of a completions request: a string, strings, token ids or id lists."""
    if isinstance(prompt, str):
        return [llm.encode(prompt)]
    if not prompt:
        raise HTTPError(400, "prompt: must not be empty")
    if isinstance(prompt[0], str):
        return [llm.encode(x) for x in cast(list[str], prompt)]
    if isinstance(prompt[0], int):
        return [cast(list[int], prompt)]
    return cast(list[list[int]], prompt)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character a byte-level BPE writes for each byte -> the byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


_BYTE_DECODER = _byte_decoder()


def _token_bytes(llm: HFLLM, ids: list[int]) -> list[bytes]:
    """Each generated token's own bytes: a token may hold part of a multi-byte character, which decoding it
    alone would turn into U+FFFD. Byte-level BPE pieces map back through the GPT-2 alphabet, SentencePiece
    byte-fallback pieces (``<0xE2>``) are their byte; special tokens, and pieces of other vocabularies,
    are their decoded text."""
    out = []
    for i, piece in zip(ids, llm.tokenizer.convert_ids_to_tokens(ids), strict=True):
        if piece is None or i in llm.tokenizer.all_special_ids:
            out.append(llm.tokenizer.decode([i]).encode())
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out.append(bytes([int(piece[3:5], 16)]))
        elif all(c in _BYTE_DECODER for c in piece):
            out.append(bytes(_BYTE_DECODER[c] for c in piece))
        else:
            out.append(llm.tokenizer.decode([i]).encode())
    return out


def _token_text(raw: bytes) -> str:
    """A token's text for OpenAI's ``tokens`` list: its characters, or ``bytes:\\xNN...`` when it holds part
    of a character (OpenAI's own form for such tokens)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _text_offsets(pieces: list[bytes]) -> list[int]:
    """The character offset in the text where each token starts (a token that continues a character points at
    that character's start)."""
    out, prefix = [], b""
    for raw in pieces:
        out.append(len(prefix.decode("utf-8", errors="ignore")))
        prefix += raw
    return out


def create_app(llm: HFLLM, model_name: str, api_key: str | None = None, limits: ServerLimits | None = None) -> FastAPI:
    """The FastAPI app serving ``llm`` as ``model_name``; Bearer ``api_key`` is required when given."""
    lim = limits or ServerLimits()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.batcher = Batcher(llm, lim.max_batch)
        yield
        app.state.batcher.close()

    def check_key(request: Request) -> None:
        if api_key is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                raise HTTPError(401, "invalid or missing API key (Authorization: Bearer ...)", "authentication_error")

    app = FastAPI(title="dreamgym serve", lifespan=lifespan, dependencies=[Depends(check_key)])

    @app.exception_handler(HTTPError)
    async def on_http_error(_: Request, e: HTTPError) -> JSONResponse:
        return _error(e.status, e.message, e.kind)

    @app.exception_handler(StarletteHTTPException)  # unknown routes and methods, in OpenAI's error shape too
    async def on_route_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return _error(e.status_code, str(e.detail), "not_found_error" if e.status_code == 404 else "invalid_request_error")

    @app.exception_handler(ClientDisconnect)
    async def on_disconnect(_: Request, e: ClientDisconnect) -> JSONResponse:
        return _error(400, "client disconnected")  # nobody reads it; nothing else to do

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "dreamgym", "max_model_len": llm.max_length}
        return {"object": "list", "data": [card]}

    @app.post("/v1/load_weights")
    async def load_weights(request: Request) -> JSONResponse:
        """New weights between rollouts (the trainer's weight sync): the rows in flight finish under the old
        ones, every later request is answered by the new ones, and each completion says its ``weight_version``.
        Only a server with an API key accepts it: whoever can load weights decides what the model says."""
        if api_key is None:
            raise HTTPError(403, "load_weights needs a server started with an API key (--api-key-env)",
                            "permission_error")
        req = await _read(request, LoadWeightsRequest, lim.max_body_bytes)
        batcher = app.state.batcher
        version = req.version if req.version is not None else batcher.weight_version + 1
        if version <= batcher.weight_version:
            raise HTTPError(409, f"version {version} is not newer than the served version {batcher.weight_version}")
        try:
            weights = await asyncio.to_thread(read_weights, req.path)
            served = await asyncio.wrap_future(batcher.reload(weights, version))
        except (OSError, ValueError, RuntimeError) as e:
            raise HTTPError(400, f"load_weights {req.path}: {str(e).splitlines()[0]}") from None
        log.info("serving weights %s as version %d", req.path, served)
        return JSONResponse({"path": req.path, "weight_version": served})

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        """Batching counters (not part of the OpenAI API)."""
        b = app.state.batcher
        return {
            "weight_version": b.weight_version,
            "forward_passes": b.forward_passes,
            "rows_finished": b.rows,
            "mean_rows_per_decode_step": round(b.row_steps / max(1, b.forward_passes), 2),
            "rows_aborted": b.aborted,
        }

    def check_common(req: _Request, max_tokens: int) -> list[str]:
        if req.model != model_name:
            raise HTTPError(404, f"model {req.model!r} not found; this server serves {model_name!r}", "not_found_error")
        if req.stream:
            raise HTTPError(400, "streaming is not supported by dreamgym serve")
        if req.n > lim.max_n:
            raise HTTPError(400, f"n={req.n} exceeds the limit of {lim.max_n}")
        if max_tokens > lim.max_tokens:
            raise HTTPError(400, f"max_tokens={max_tokens} exceeds the limit of {lim.max_tokens}")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if any(not s for s in stop):
            raise HTTPError(400, "stop strings must be non-empty")
        return stop

    async def run(request: Request, req: _Request, prompts: list[list[int]], max_tokens: int, stop: list[str],
                  logprobs: bool) -> list[Completion]:
        for ids in prompts:
            if lim.max_prompt_tokens is not None and len(ids) > lim.max_prompt_tokens:
                raise HTTPError(400, f"prompt has {len(ids)} tokens; the limit is {lim.max_prompt_tokens}")
        if req.guided_choice is not None and (not req.guided_choice or not all(req.guided_choice)):
            raise HTTPError(400, "guided_choice must be a non-empty list of non-empty strings")
        rows: list[list[int]] = []
        params: list[SamplingParams] = []
        for ids in prompts:
            for _ in range(req.n):
                seed = None if req.seed is None else req.seed + len(rows)
                params.append(SamplingParams(max_tokens, req.temperature, req.top_p, stop, seed, logprobs,
                                             req.guided_choice))
                rows.append(ids)
        if len(rows) > lim.max_batch:
            raise HTTPError(400, f"{len(rows)} rows (prompts x n) exceed the batch limit of {lim.max_batch}")
        for ids, p in zip(rows, params, strict=True):
            try:
                llm.check_prompt(ids, p)
            except ValueError as e:
                raise HTTPError(400, str(e)) from None
        future = app.state.batcher.submit(rows, params)
        waiting = asyncio.wrap_future(future)
        timeout = req.timeout or lim.request_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        # Wait for the rows, checking that the client is still there: a client that has gone (or a passed
        # deadline) aborts its rows, so the batch stops spending forward passes on answers nobody reads.
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=lim.poll_s)
            if done:
                return waiting.result()
            gone = await request.is_disconnected()
            if gone or (deadline is not None and time.monotonic() > deadline):
                app.state.batcher.abort(future)
                waiting.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits it now
                if gone:
                    raise ClientDisconnect()
                raise HTTPError(408, f"the request passed its deadline of {timeout:g} s", "timeout")

    def usage(prompts: list[list[int]], done: list[Completion]) -> dict[str, int]:
        prompt = sum(len(ids) for ids in prompts)
        gen = sum(len(c.token_ids) for c in done)
        return {"prompt_tokens": prompt, "completion_tokens": gen, "total_tokens": prompt + gen}

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        req = await _read(request, CompletionRequest, lim.max_body_bytes)
        stop = check_common(req, req.max_tokens)
        if req.echo:
            raise HTTPError(400, "echo is not supported by dreamgym serve")
        prompts = _prompt_ids(llm, req.prompt)
        done = await run(request, req, prompts, req.max_tokens, stop, req.logprobs is not None)
        choices = []
        for i, c in enumerate(done):
            choice: dict[str, Any] = {"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
            if c.logprobs is not None:
                pieces = _token_bytes(llm, c.token_ids)
                tokens, offsets = [_token_text(raw) for raw in pieces], _text_offsets(pieces)
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": c.logprobs, "top_logprobs": None, "text_offset": offsets}
            if req.return_token_ids:
                choice["token_ids"], choice["prompt_token_ids"] = c.token_ids, c.prompt_ids
            choices.append(choice)
        body = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "weight_version": done[0].weight_version if done else app.state.batcher.weight_version,
            "choices": choices,
            "usage": usage(prompts, done),
        }
        return JSONResponse(body)  # plain JSON: FastAPI's response-model encoding is slow for long id lists

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        req = await _read(request, ChatRequest, lim.max_body_bytes)
        try:
            prompt = llm.encode([m.model_dump() for m in req.messages])
        except ValueError as e:
            raise HTTPError(400, str(e)) from None
        room = lim.max_tokens if llm.max_length is None else max(1, min(lim.max_tokens, llm.max_length - len(prompt)))
        max_tokens = req.max_completion_tokens or req.max_tokens or min(lim.chat_max_tokens, room)
        stop = check_common(req, max_tokens)
        done = await run(request, req, [prompt], max_tokens, stop, req.logprobs)
        choices = []
        for i, c in enumerate(done):
            choice: dict[str, Any] = {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "finish_reason": c.finish_reason,
                "logprobs": None,
            }
            if c.logprobs is not None:
                content = [
                    {"token": _token_text(raw), "logprob": lp, "bytes": list(raw), "top_logprobs": []}
                    for raw, lp in zip(_token_bytes(llm, c.token_ids), c.logprobs, strict=True)
                ]
                choice["logprobs"] = {"content": content}
            if req.return_token_ids:
                choice["token_ids"], choice["prompt_token_ids"] = c.token_ids, c.prompt_ids
            choices.append(choice)
        body = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "weight_version": done[0].weight_version if done else app.state.batcher.weight_version,
            "choices": choices,
            "usage": usage([prompt], done),
        }
        return JSONResponse(body)

    return app


# ------------------------------------------------------------------------------------------ running


class BackgroundServer:
    """Runs an app with uvicorn in a daemon thread on ``host:port`` (port 0: a free one). For tests, benchmarks
    and in-process demos; ``dreamgym serve`` runs uvicorn in the foreground instead."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()


def serve(
    model_dir: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    model_name: str | None = None,
    limits: ServerLimits | None = None,
    device: str = "cpu",
    dtype: str = "float32",
) -> None:
    """Load ``model_dir`` and serve it in the foreground until interrupted."""
    lim = limits or ServerLimits()
    llm = HFLLM.from_pretrained(model_dir, device=device, dtype=dtype, max_batch_size=lim.max_batch)
    name = model_name or model_dir  # as vLLM does: clients send the path (or hub name) they were given
    if api_key is None and host not in {"127.0.0.1", "localhost", "::1"}:
        log.warning("serving on %s without an API key: anyone who can reach it can use the model", host)
    log.warning("serving %s as %r on http://%s:%d/v1", model_dir, name, host, port)
    uvicorn.run(create_app(llm, name, api_key, lim), host=host, port=port, log_level="warning")
