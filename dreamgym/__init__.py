"""dreamgym: train LLM agents with reinforcement learning on synthesised experience."""

from dreamgym.envs import TextEnv, make, register, registered
from dreamgym.types import SCHEMA_VERSION, DataError, Task, Trajectory, Transition

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "DataError",
    "Task",
    "TextEnv",
    "Trajectory",
    "Transition",
    "__version__",
    "make",
    "register",
    "registered",
]
