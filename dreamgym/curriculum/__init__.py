"""The curriculum: reward variance per task group, a task generator for high-variance tasks, the task set."""

from dreamgym.curriculum.generator import (
    LLMVariationOperator,
    TaskGenerator,
    VariationOperator,
    cluster_groups,
    parse_variations,
    variation_operator,
)
from dreamgym.curriculum.taskset import TaskEntry, TaskSet
from dreamgym.rl.advantages import reward_variance

__all__ = [
    "LLMVariationOperator",
    "TaskEntry",
    "TaskGenerator",
    "TaskSet",
    "VariationOperator",
    "cluster_groups",
    "parse_variations",
    "reward_variance",
    "variation_operator",
]
