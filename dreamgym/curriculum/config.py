"""The curriculum's settings (``RLConfig.curriculum``): which task generator M_task, how many seeds and
variations per iteration, and λ, the largest share of synthetic tasks in a batch. Used in dream runs only:
the real env's task set stays fixed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dreamgym.curriculum.generator import TaskGenerator, variation_operator


class CurriculumConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_generator: str = Field(default="rule", description="rule (env's variation operator) | llm | none")
    synthetic_share: float = Field(default=0.25, ge=0, le=1, description="λ: max share of synthetic tasks/batch")
    seeds_per_iter: int = Field(default=4, ge=0)
    variations_per_seed: int = Field(default=2, ge=1)

    def task_generator_for(self, env: str, env_kwargs: dict[str, Any], llm: Any = None) -> TaskGenerator | None:
        """M_task for ``env`` (``llm``: what the ``llm`` generator prompts); None without task generation."""
        if self.seeds_per_iter == 0:
            return None
        operator = variation_operator(self.task_generator, env, env_kwargs, llm)
        if operator is None:
            return None
        return TaskGenerator(operator, self.seeds_per_iter, self.variations_per_seed)


CURRICULUM_FIELDS = frozenset(CurriculumConfig.model_fields)

__all__ = ["CURRICULUM_FIELDS", "CurriculumConfig"]
