"""Continuous batching for ``dreamgym serve``: concurrent requests share the forward passes of one model."""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import torch

from dreamgym.llm.base import Completion, SamplingParams
from dreamgym.llm.decode import DecodeBatch, Row
from dreamgym.llm.hf import HFLLM

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Pending:
    """A request waiting for its rows (prompts x n) to finish."""

    prompt_ids: list[list[int]]
    params: list[SamplingParams]
    future: Future[list[Completion]] = field(default_factory=Future)
    done: list[Completion | None] = field(default_factory=list)
    remaining: int = 0
    weight_version: int = 0  # the weights its rows were admitted (and so generated) under


@dataclass
class _Reload:
    """New weights for the served model, applied once no row is in flight (:meth:`Batcher.reload`)."""

    weights: dict[str, torch.Tensor]
    version: int
    future: Future[int] = field(default_factory=Future)


class Batcher:
    """Continuous batching on one worker thread, which keeps a running :class:`DecodeBatch`.

    Between decode steps, pending requests join the batch (their prompts are prefilled and merged into the
    KV cache, up to ``max_batch`` rows) and finished requests are answered at once. Concurrent clients share
    every forward pass, and no request waits for a whole batch to finish: clients in a closed loop (send,
    wait, send again) would otherwise split into half-size cohorts that take turns. A model whose cache
    cannot merge (sliding-window layers) runs one batch at a time instead.
    """

    def __init__(self, llm: HFLLM, max_batch: int = 64) -> None:
        self.llm, self.max_batch = llm, max_batch
        self._queue: queue.Queue[_Pending | _Reload | None] = queue.Queue()
        self._held: _Pending | _Reload | None = None  # taken from the queue, waiting for room (or an idle batch)
        self._owner: dict[Row, tuple[_Pending, int]] = {}
        self._aborts: queue.Queue[Future[list[Completion]]] = queue.Queue()  # requests whose client has gone
        self.aborted = 0  # rows dropped mid-generation because their client had gone
        self.forward_passes = 0  # counters for /stats
        self.row_steps = 0  # rows in the batch, summed over forward passes
        self.rows = 0  # rows finished
        self.weight_version = 0  # bumped by each reload
        self._thread = threading.Thread(target=self._work, name="dreamgym-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[list[int]], params: list[SamplingParams]) -> Future[list[Completion]]:
        pending = _Pending(prompt_ids, params)
        self._queue.put(pending)
        return pending.future

    def reload(self, weights: dict[str, torch.Tensor], version: int) -> Future[int]:
        """Serve ``weights`` (a state dict of the served model; tied weights may be left out) as ``version`` from
        the requests queued after this call on: the rows in flight finish under the old weights first, so no
        completion mixes two versions. The future fails, and the old weights stay, if they do not fit."""
        item = _Reload(weights, version)
        self._queue.put(item)
        return item.future

    def _apply(self, item: _Reload) -> None:
        model = self.llm.model
        params = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
        try:
            unknown = sorted(set(item.weights) - set(params))
            wrong = [k for k, w in item.weights.items() if k in params and params[k].shape != w.shape]
            given = {params[k].data_ptr() for k in item.weights if k in params}
            missing = [k for k, p in model.named_parameters(remove_duplicate=False)
                       if k not in item.weights and p.data_ptr() not in given]  # a tied copy is not missing
            if unknown or wrong or missing:
                raise ValueError(f"the weights do not fit the served model: unknown {unknown[:3]}, wrong shape "
                                 f"{wrong[:3]}, missing {missing[:3]}")
            with torch.inference_mode(False), torch.no_grad():  # checked first, so nothing is half loaded
                for k, w in item.weights.items():
                    params[k].copy_(w.to(params[k].dtype))
        except Exception as e:
            item.future.set_exception(e)
            return
        self.weight_version = item.version
        item.future.set_result(item.version)

    def abort(self, future: Future[list[Completion]]) -> None:
        """Stop generating for a request whose client has gone: a waiting one is dropped before it joins, a
        running one loses its rows before the next decode step (as vLLM aborts a disconnected request)."""
        if not future.cancel():
            self._aborts.put(future)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=60)

    def _work(self) -> None:
        batch = self.llm.new_batch()
        with torch.inference_mode():
            while True:
                try:
                    if not self._admit(batch):
                        return
                    self._drop_aborted()
                    if batch.active:
                        before = batch.forward_passes
                        finished = batch.step()
                        self.forward_passes += batch.forward_passes - before
                        self.row_steps += len(batch.rows)
                        self._deliver(finished)
                except Exception as e:  # e.g. out of memory: fail the requests in flight, keep serving
                    log.exception("generation failed; failing %d requests in flight", len(self._owner))
                    for pending in {p for p, _ in self._owner.values()}:
                        pending.future.set_exception(e)
                    self._owner.clear()
                    batch = self.llm.new_batch()

    def _admit(self, batch: DecodeBatch) -> bool:
        """Move pending requests into the batch while there is room (blocking while the batch is idle).
        Returns False once the server is closing."""
        joinable = batch.active == 0 or batch.can_join()
        room = self.max_batch - batch.active
        admitted: list[_Pending] = []
        while joinable and (room > 0 or not (admitted or batch.active)):
            item: _Pending | _Reload | None
            if self._held is not None:
                item, self._held = self._held, None
            else:
                try:
                    block = not admitted and not batch.active
                    item = self._queue.get() if block else self._queue.get_nowait()
                except queue.Empty:
                    break
            if item is None:
                return False
            if isinstance(item, _Reload):
                if admitted or batch.active:  # after the rows in flight
                    self._held = item
                    break
                self._apply(item)
                continue
            if len(item.prompt_ids) > room and (admitted or batch.active):
                self._held = item
                break
            # A request whose client went away was cancelled; skip it. Past this point cancel() fails.
            if item.future.set_running_or_notify_cancel():
                admitted.append(item)
                room -= len(item.prompt_ids)
        if admitted:
            self._join(batch, admitted)
        return True

    def _join(self, batch: DecodeBatch, admitted: list[_Pending]) -> None:
        before = batch.forward_passes
        try:
            rows = batch.add([ids for p in admitted for ids in p.prompt_ids], [sp for p in admitted for sp in p.params])
        except Exception as e:
            if len(admitted) > 1:  # find the bad request instead of failing its neighbours
                for p in admitted:
                    self._join(batch, [p])
                return
            log.exception("prefill failed")
            admitted[0].future.set_exception(e)
            return
        self.forward_passes += batch.forward_passes - before
        start = 0
        for p in admitted:
            p.done, p.remaining = [None] * len(p.prompt_ids), len(p.prompt_ids)
            p.weight_version = self.weight_version
            for i, row in enumerate(rows[start : start + len(p.prompt_ids)]):
                self._owner[row] = (p, i)
            start += len(p.prompt_ids)
        self._deliver([r for r in rows if r.finish is not None])

    def _drop_aborted(self) -> None:
        """Mark the rows of aborted requests finished (the batch prunes them) and forget their requests."""
        gone: set[int] = set()
        while True:
            try:
                gone.add(id(self._aborts.get_nowait()))
            except queue.Empty:
                break
        if not gone:
            return
        for row, (pending, _) in list(self._owner.items()):
            if id(pending.future) in gone:
                row.finish = "length"  # finished for the batch; nobody reads it
                del self._owner[row]
                self.aborted += 1
                if not pending.future.done():
                    pending.future.set_exception(TimeoutError("aborted: the client has gone"))

    def _deliver(self, finished: list[Row]) -> None:
        for row in finished:
            pending, i = self._owner.pop(row)
            pending.done[i] = replace(row.completion(self.llm.tokenizer), weight_version=pending.weight_version)
            pending.remaining -= 1
            self.rows += 1
            if pending.remaining == 0:
                pending.future.set_result([c for c in pending.done if c is not None])
