"""The run's task set: the environment's seed tasks plus the curriculum's synthetic variations.

Each entry keeps its origin, the iteration it was added and its reward-variance history. Sampling bounds
the share of synthetic tasks per batch by λ (``synthetic_share``) so the original task set stays covered.
Saved as JSONL (one entry a line) with an atomic replace, so a run resumes with the exact task set.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from dreamgym.types import DataError, Task


class TaskEntry(BaseModel):
    task: Task
    added_iteration: int = -1  # -1: a seed task of the environment
    variances: list[float] = Field(default_factory=list)  # V_τ at each iteration the task was rolled out
    times_sampled: int = 0

    @property
    def last_variance(self) -> float | None:
        return self.variances[-1] if self.variances else None


class TaskSet:
    def __init__(self, seed_tasks: Iterable[Task] = ()) -> None:
        self.entries: dict[str, TaskEntry] = {}
        self._instructions: set[str] = set()
        self.add(seed_tasks, iteration=-1)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.entries

    @property
    def seed_ids(self) -> list[str]:
        return [i for i, e in self.entries.items() if e.task.origin == "seed"]

    @property
    def synthetic_ids(self) -> list[str]:
        return [i for i, e in self.entries.items() if e.task.origin == "synthetic"]

    def add(self, tasks: Iterable[Task], iteration: int) -> list[Task]:
        """Add tasks; duplicates (same id or same instruction) are skipped. Returns the tasks added."""
        added = []
        for task in tasks:
            key = " ".join(task.instruction.lower().split())
            if task.task_id in self.entries or key in self._instructions:
                continue
            self.entries[task.task_id] = TaskEntry(task=task, added_iteration=iteration)
            self._instructions.add(key)
            added.append(task)
        return added

    def record_variances(self, variances: dict[str, float]) -> None:
        for task_id, v in variances.items():
            if task_id in self.entries:
                self.entries[task_id].variances.append(float(v))

    def sample(self, n: int, rng: random.Random, synthetic_share: float) -> list[Task]:
        """``n`` tasks, distinct while the set is large enough (then repeated), at most ⌊λ·n⌋ synthetic ones
        unless the seed tasks run out."""
        if not 0.0 <= synthetic_share <= 1.0:
            raise ValueError(f"synthetic_share (λ) must be in [0, 1], got {synthetic_share}")
        synthetic, seeds = self.synthetic_ids, self.seed_ids
        n_syn = min(len(synthetic), int(synthetic_share * n))
        n_seed = min(len(seeds), n - n_syn)
        n_syn = min(len(synthetic), n - n_seed)  # fill from synthetic only if the seed tasks run out
        chosen = rng.sample(synthetic, n_syn) + rng.sample(seeds, n_seed)
        if chosen and len(chosen) < n:  # a set smaller than the batch: repeat tasks (each is its own group)
            chosen += [rng.choice(chosen) for _ in range(n - len(chosen))]
        rng.shuffle(chosen)
        for task_id in chosen:
            self.entries[task_id].times_sampled += 1
        return [self.entries[i].task for i in chosen]

    def tasks(self, ids: Sequence[str] | None = None) -> list[Task]:
        return [self.entries[i].task for i in (ids if ids is not None else list(self.entries))]

    # -- persistence --------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        tmp = p.with_suffix(p.suffix + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for entry in self.entries.values():
                f.write(entry.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TaskSet:
        p = Path(path)
        out = cls()
        for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entry = TaskEntry.model_validate_json(line)
            except ValueError as e:
                raise DataError(f"{p}:{lineno}: invalid task entry ({str(e).splitlines()[0]})") from None
            out.entries[entry.task.task_id] = entry
            out._instructions.add(" ".join(entry.task.instruction.lower().split()))
        return out
