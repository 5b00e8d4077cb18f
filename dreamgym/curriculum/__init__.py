"""The curriculum: a task generator for high-variance tasks and the task set (the reward variance per task
group it selects by is :func:`dreamgym.rl.advantages.reward_variance`)."""

from dreamgym.curriculum.generator import (
    LLMVariationOperator,
    TaskGenerator,
    VariationOperator,
    cluster_groups,
    parse_variations,
    variation_operator,
)
from dreamgym.curriculum.taskset import TaskEntry, TaskSet

__all__ = [
    "LLMVariationOperator",
    "TaskEntry",
    "TaskGenerator",
    "TaskSet",
    "VariationOperator",
    "cluster_groups",
    "parse_variations",
    "variation_operator",
]
