"""Data-parallel RL through Hugging Face ``accelerate``: the world a run trains in.

``accelerate launch --multi_gpu --num_processes N -m dreamgym train ...`` starts N ranks (torchrun; on a machine
without GPUs ``--multi_gpu`` is only the multi-process launcher and the ranks talk over gloo on the CPU; an
``accelerate config`` file may choose FSDP or DeepSpeed instead of DDP). Every rank:

* draws the SAME task sample from the same seeded trainer rng and rolls out its contiguous share of it
  (:meth:`Dist.shard`) in its own env pool, so GRPO groups never straddle ranks and the global batch is the
  1-process batch (group ``k`` resets with seed ``seed + k`` on whichever rank plays it);
* updates the model wrapped by ``accelerator.prepare`` (DDP by default): each minibatch is the 1-process
  minibatch (the same permutation of the global row indices), of which a rank computes the rows it owns;
* gathers the counters (real and synthetic transitions summed over ranks), the metrics and the curriculum's
  variances, so every rank holds the same :class:`~dreamgym.rl.checkpoint.TrainState`.

Rank 0 alone evaluates, logs (tensorboard, ``metrics.jsonl``, the console, ``summary.json``) and checkpoints (the
unwrapped model). Loss normalisation: a micro-batch's loss is weighted by its share of the GLOBAL minibatch
(tokens for ``token-mean``, else turns), times the world size because DDP averages the ranks' gradients; the sum
over ranks is then exactly the 1-process minibatch gradient (tests/test_distributed.py checks it to 1e-5).

Without a launcher (``WORLD_SIZE`` unset or 1) no ``Accelerator`` is created and :class:`Dist` is the identity:
plain ``loss.backward()`` and ``clip_grad_norm_``, so a 1-process run is bit for bit what it was.

Checkpoints hold the full model and optimizer (rank 0's; DDP keeps them replicated) and the trainer rng that
every rank shares, so a run resumes under any world size (``world_size`` is recorded; a change is reported).
Rollouts generate with, and checkpoints save, the unwrapped model: engines that shard the parameters (FSDP,
DeepSpeed ZeRO-3) would need them gathered for both, which is not done yet; DDP and ZeRO-1/2 keep them whole.
Dream runs need ``dream.buffer`` unset (the ranks would write one replay buffer). Timings and ``tokens_per_s``
in the metrics are rank 0's; ``real_env_s`` adds the slowest rank's env time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn


class Dist:
    """The ranks of a run (``accelerator`` None: one process, and every method is the identity)."""

    def __init__(self, accelerator: Any = None, device: str = "cpu") -> None:
        self.accelerator = accelerator
        self._device = torch.device(device)  # one process: where the models live (RLConfig.device)
        self.rank: int = accelerator.process_index if accelerator is not None else 0
        self.world_size: int = accelerator.num_processes if accelerator is not None else 1

    @classmethod
    def from_env(cls, device: str = "cpu") -> Dist:
        """An ``Accelerator`` when a launcher started more than one process (``WORLD_SIZE`` > 1), else one process
        on ``device``."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return cls(device=device)
        from accelerate import Accelerator

        return cls(Accelerator(cpu=not torch.cuda.is_available()))  # no GPU: gloo on the CPU

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        return self.accelerator.device if self.accelerator is not None else self._device

    def shard(self, n: int) -> tuple[int, int]:
        """This rank's contiguous share ``[lo, hi)`` of ``n`` items (shares differ by at most one item)."""
        return n * self.rank // self.world_size, n * (self.rank + 1) // self.world_size

    # ---- collectives (every rank must call them, in the same order)
    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order (``[obj]`` on one process)."""
        if self.accelerator is None:
            return [obj]
        from accelerate.utils import gather_object

        return list(gather_object([obj]))

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.accelerator is None:
            return obj
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([obj], from_process=0)[0]

    def barrier(self) -> None:
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()

    # ---- the model
    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The wrapped (DDP/FSDP/DeepSpeed) model to train through and its optimizer; the same pair on one process."""
        if self.accelerator is None:
            return model, optimizer
        wrapped, opt = self.accelerator.prepare(model, optimizer)
        return wrapped, opt

    def backward(self, loss: Tensor) -> None:
        if self.accelerator is None:
            loss.backward()
        else:
            self.accelerator.backward(loss)

    def no_sync(self, model: nn.Module, skip: bool) -> contextlib.AbstractContextManager[Any]:
        """Accumulate gradients without all-reducing them (``skip``: every micro-batch but a minibatch's last)."""
        if self.accelerator is None or not skip:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(model)

    def clip_grad_norm_(self, model: nn.Module, max_norm: float) -> Tensor:
        """Clip the (all-reduced) gradient; its norm before clipping (NaN where the engine keeps it, DeepSpeed)."""
        if self.accelerator is None:
            return nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        norm = self.accelerator.clip_grad_norm_(model.parameters(), max_norm)
        return norm if norm is not None else torch.tensor(float("nan"))


def owned(order: Sequence[int], lo: int, hi: int) -> list[int]:
    """The global row indices of ``order`` that this rank holds (``[lo, hi)``), as local indices."""
    return [i - lo for i in order if lo <= i < hi]


__all__ = ["Dist", "owned"]
