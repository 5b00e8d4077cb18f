"""The curriculum task generator M_task: variations of tasks whose group reward variance is high.

``V_τ = mean((r − mean r)²)`` over a task's rollouts (``dreamgym.rl.advantages.reward_variance``) is > 0 only
when the policy sometimes succeeds and sometimes fails: feasible yet challenging. Each iteration the
generator picks the top-m tasks by V_τ (above ``min_variance``) as seeds and asks a variation operator for
variations of each. Operators: the shop's rule-based one (CPU default) or :class:`LLMVariationOperator`,
which prompts any LLM backend (the experience model's weights in the paper) as in the paper's WebShop prompt:
write numbered candidate variations, then ``SELECTION: [n]`` and ``REASONING: ...``.
With PPO there are no per-task groups: :func:`cluster_groups` clusters tasks by a semantic embedding and each
cluster is a group.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from dreamgym.curriculum.taskset import TaskSet
from dreamgym.llm.base import LLM, SamplingParams
from dreamgym.types import Task

log = logging.getLogger(__name__)


class VariationOperator(Protocol):
    def __call__(self, seed: Task, n: int, rng: random.Random) -> list[Task]: ...


class TaskGenerator:
    """Selects high-variance seeds and adds their variations to a :class:`TaskSet`."""

    def __init__(
        self, operator: VariationOperator, seeds_per_iter: int = 4, variations_per_seed: int = 2,
        min_variance: float = 1e-6,
    ) -> None:
        self.operator = operator
        self.seeds_per_iter = seeds_per_iter
        self.variations_per_seed = variations_per_seed
        self.min_variance = min_variance

    def select_seeds(self, variances: dict[str, float], taskset: TaskSet) -> list[Task]:
        """The top ``seeds_per_iter`` tasks by V_τ among those above ``min_variance`` (ties: by id)."""
        ranked = sorted(
            ((v, i) for i, v in variances.items() if v > self.min_variance and i in taskset), key=lambda x: (-x[0], x[1])
        )
        return [taskset.entries[i].task for _, i in ranked[: self.seeds_per_iter]]

    def step(self, variances: dict[str, float], taskset: TaskSet, iteration: int, rng: random.Random) -> list[Task]:
        """Record the variances, generate variations of the best seeds, add the new ones; returns them."""
        taskset.record_variances(variances)
        proposed: list[Task] = []
        for seed in self.select_seeds(variances, taskset):
            proposed.extend(self.operator(seed, self.variations_per_seed, rng))
        return taskset.add(proposed, iteration)


# ------------------------------------------------------------------------------------------ LLM operator

_CANDIDATE = re.compile(r"^\s*(?:TASK\s*)?\[?(\d+)\]?\s*[:.)-]\s*(.+?)\s*$", re.IGNORECASE)
_SELECTION = re.compile(r"SELECTION\s*:\s*\[?\s*(\d+)\s*\]?", re.IGNORECASE)


def variation_prompt(seed: Task, n_candidates: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You write new tasks for training a web agent."},
        {"role": "user", "content": (
            f"Original task: {seed.instruction}\n"
            f"Write {n_candidates} variations of it, one per line as 'TASK [n]: ...'. Each must be more specific "
            "or more complex than the original, still feasible, clear, meaningfully different from it and from "
            "each other, and use realistic attribute, option and price combinations.\n"
            "Then choose the best one: 'SELECTION: [n]' and 'REASONING: ...'."
        )},
    ]


def parse_variations(text: str, n_candidates: int) -> tuple[list[str], int | None]:
    """The numbered candidates and the selected number (None if absent/invalid). Never raises."""
    candidates: dict[int, str] = {}
    for line in text.splitlines():
        if _SELECTION.search(line) or line.strip().upper().startswith("REASONING"):
            continue
        m = _CANDIDATE.match(line)
        if m and 1 <= int(m.group(1)) <= n_candidates and m.group(1) not in candidates:
            candidates[int(m.group(1))] = m.group(2)
    sel = _SELECTION.search(text)
    selected = int(sel.group(1)) if sel and int(sel.group(1)) in candidates else None
    return [candidates[k] for k in sorted(candidates)], selected


def well_formed(instruction: str, seed: Task, min_words: int = 4, max_chars: int = 300) -> bool:
    """A usable task: a plain sentence of reasonable length that is not the seed itself."""
    text = " ".join(instruction.split())
    return (len(text.split()) >= min_words and len(text) <= max_chars and text.lower() != seed.instruction.lower()
            and not any(t in text for t in ("<", ">", "SELECTION", "TASK [")))


class LLMVariationOperator:
    """The paper's M_task through any generation backend. Malformed outputs and tasks are discarded (counted)."""

    def __init__(self, llm: LLM, n_candidates: int = 4, max_new_tokens: int = 256, temperature: float = 0.8) -> None:
        self.llm = llm
        self.n_candidates = n_candidates
        self.params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
        self.discarded = 0

    def __call__(self, seed: Task, n: int, rng: random.Random) -> list[Task]:
        prompts = [variation_prompt(seed, self.n_candidates)] * n
        params = SamplingParams(max_new_tokens=self.params.max_new_tokens, temperature=self.params.temperature,
                                seed=rng.randrange(2**31))
        out = []
        for completion in self.llm.generate(prompts, params):
            candidates, selected = parse_variations(completion.text, self.n_candidates)
            choice = candidates[selected - 1] if selected is not None and selected <= len(candidates) else None
            if choice is None or not well_formed(choice, seed):
                self.discarded += 1
                continue
            task_id = "syn-" + hashlib.sha1(choice.lower().encode()).hexdigest()[:12]
            # The goal is only the instruction: in the dream, M_exp scores the episode from the instruction.
            out.append(Task(task_id=task_id, instruction=" ".join(choice.split()), env=seed.env, goal={},
                            origin="synthetic", parent_id=seed.task_id))
        if self.discarded:
            log.info("task generator: %d malformed variations discarded so far", self.discarded)
        return out


# ------------------------------------------------------------------------------------------ PPO groups


def cluster_groups(tasks: Sequence[Task], encoder: Any, n_clusters: int, seed: int = 0) -> dict[str, int]:
    """Task id -> cluster (k-means with faiss on the encoder's unit-norm embeddings of the instructions)."""
    import faiss

    if not tasks:
        return {}
    k = max(1, min(n_clusters, len(tasks)))
    x = np.ascontiguousarray(encoder.encode([t.instruction for t in tasks]), dtype=np.float32)
    if k == 1:
        return {t.task_id: 0 for t in tasks}
    kmeans = faiss.Kmeans(x.shape[1], k, niter=20, seed=seed, spherical=True, min_points_per_centroid=1)
    kmeans.train(x)
    _, assign = kmeans.index.search(x, 1)
    return {t.task_id: int(c) for t, c in zip(tasks, assign[:, 0], strict=True)}


def variation_operator(kind: str, env: str, env_kwargs: dict[str, Any], llm: LLM | None = None) -> VariationOperator | None:
    """``rule``: the env's rule-based operator (its :attr:`EnvSpec.variation_operator`, built with the env's
    kwargs it accepts); ``llm``: :class:`LLMVariationOperator` on ``llm`` (the experience model's weights, as in
    the paper); ``none``: no task generation (the "without task generation" ablation)."""
    import inspect

    from dreamgym.envs.base import find_spec

    if kind == "none":
        return None
    if kind == "llm":
        if llm is None:
            raise ValueError("task_generator 'llm' needs an LLM (the experience model's)")
        return LLMVariationOperator(llm)
    if kind != "rule":
        raise ValueError(f"unknown task generator {kind!r}; choose rule, llm or none")
    env_spec = find_spec(env)
    cls = env_spec.load("variation_operator") if env_spec is not None else None
    if cls is None:
        raise ValueError(f"env {env!r} has no rule-based task variations; use task_generator 'llm' or 'none'")
    accepted = inspect.signature(cls).parameters
    operator: VariationOperator = cls(**{k: v for k, v in env_kwargs.items() if k in accepted})
    return operator
