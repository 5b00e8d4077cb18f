"""The dream: an environment backed by the experience model, with the same API as every real env.

``DreamEnv`` is a :class:`~dreamgym.envs.base.TextEnv`: ``reset(options={"task": ...})`` gives the task's
initial abstract state, ``step(action)`` asks M_exp for the next state, reward and done. The *grammar* of
the environment (which actions a state offers, whether an action is valid) comes from the real env's
``admissible_for_state`` / ``action_valid_for_state`` when it has them: an invalid action then gets the real
env's answer (state unchanged, reward 0, ``invalid_action``) without a model call. No real transition is
ever consumed: the real env object is only a grammar.

``DreamEnvPool`` implements :class:`~dreamgym.envs.pool.EnvPool` and advances all its episodes with ONE
batched ``ExperienceModel.predict`` call per step; finished synthetic trajectories go back into the replay
buffer (the paper's co-evolving buffer), tagged with the pool's current ``iteration``. Its pool hooks
(:class:`~dreamgym.envs.pool.PoolHooks`) tag, checkpoint and report that buffer and lend the experience model's
LLM and the buffer's encoder to the curriculum.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dreamgym.envs.base import TextEnv
from dreamgym.envs.pool import PoolHooks, StepResult, info_essentials
from dreamgym.experience.model import ExperienceModel, read_experience_config
from dreamgym.experience.protocol import ExperiencePrediction, ExperienceQuery
from dreamgym.experience.recall import Recall
from dreamgym.types import Source, Task, Trajectory, Transition

log = logging.getLogger(__name__)


class InitialStates:
    """Initial abstract states by task id, learned from real trajectories; a task without one (a synthetic
    task) starts from the most common initial state of the env."""

    def __init__(self, by_task: dict[str, str], default: str) -> None:
        self.by_task = by_task
        self.default = default

    @classmethod
    def from_trajectories(cls, trajs: Sequence[Trajectory]) -> InitialStates:
        by_task = {t.task.task_id: t.transitions[0].state for t in trajs if t.transitions}
        if not by_task:
            raise ValueError("no trajectory with transitions to take initial states from")
        default = Counter(by_task.values()).most_common(1)[0][0]
        return cls(by_task, default)

    def __call__(self, task: Task) -> str:
        return self.by_task.get(task.task_id, self.by_task.get(task.parent_id or "", self.default))


_EPISODES = itertools.count()  # dream episodes begun in this process


class DreamEnv(TextEnv):
    """One dreamt episode at a time. ``grammar``: the real env whose action grammar applies (optional)."""

    name = "dream"
    source: Source = "synthetic"

    def __init__(
        self,
        model: ExperienceModel,
        tasks: dict[str, list[Task]],
        initial_state: Callable[[Task], str],
        grammar: TextEnv | None = None,
        max_steps: int = 15,
    ) -> None:
        super().__init__(max_steps=max_steps)
        self.model = model
        self._tasks = tasks
        self.initial_state = initial_state
        self.grammar = grammar
        self.history: list[tuple[str, str]] = []
        self.transitions: list[Transition] = []
        self.traj_id = ""
        self.dream_failures = 0  # steps whose model output was unparsable (served the failure state)
        self._pending: ExperiencePrediction | None = None

    def tasks(self, split: str = "train") -> list[Task]:
        return list(self._tasks.get(split, []))

    # -- episode ------------------------------------------------------------------------------------
    def _reset(self, task: Task | None, split: str) -> tuple[str, dict[str, Any]]:
        if task is None:
            raise ValueError("dream env: reset needs a task (none given and the split has none)")
        self.task = task
        self.history, self.transitions = [], []
        # reproducible from the reset seed, and unique although a GRPO group resets G envs with one seed
        self.traj_id = f"dream-{int(self.np_random.integers(2**62)):016x}-{next(_EPISODES)}"
        state = self.initial_state(task)
        return state, {"admissible_actions": self._admissible(state)}

    def query_for(self, action: str) -> ExperienceQuery | None:
        """The experience model's query for ``action`` now; None when the grammar says it is invalid."""
        state = self._last_obs
        if self.grammar is not None and self.grammar.action_valid_for_state(state, action) is False:
            return None
        assert self.task is not None
        # The whole history: the protocol shows the last ``history_window`` steps numbered from the episode's
        # start, as training prompts (ExperienceQuery.at_step) do.
        return ExperienceQuery(self.task.instruction, list(self.history), [], state, action)

    def set_prediction(self, prediction: ExperiencePrediction) -> None:
        """Hand in a prediction made in a batch (``DreamEnvPool``); the next ``step`` uses it."""
        self._pending = prediction

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        state = self._last_obs
        query = self.query_for(action)
        if query is None:
            self._pending = None
            invalid = {"admissible_actions": self._last_info.get("admissible_actions", []), "invalid_action": True}
            self.history.append((state, action))  # a step of the episode, in the history as in training's
            self._record(state, action, state, 0.0, False, invalid)
            return state, 0.0, False, invalid
        prediction = self._pending or self.model.predict([query])[0]
        self._pending = None
        self.history.append((state, action))
        done = prediction.done
        info: dict[str, Any] = {
            "admissible_actions": [] if done else self._admissible(prediction.next_state),
            "success": bool(prediction.success and done),
            "reward": prediction.reward,
        }
        if prediction.failure:
            self.dream_failures += 1
            info["dream_failure"] = prediction.failure
        if prediction.recalled:
            info["recalled"] = True
        self._record(state, action, prediction.next_state, prediction.reward, done, info)
        return prediction.next_state, prediction.reward, done, info

    def had_effect(self, state: str, next_state: str) -> bool | None:
        """The real env's reading of a dreamt step (None without a grammar)."""
        return None if self.grammar is None else self.grammar.had_effect(state, next_state)

    # -- helpers ------------------------------------------------------------------------------------
    def _admissible(self, state: str) -> list[str]:
        if self.grammar is None:
            return []
        # The pool shares one grammar env; its random parts (the shop's example queries) are drawn from this
        # episode's RNG, so that a dream episode is reproducible from its reset seed like a real one.
        self.grammar.np_random = np.random.default_rng(int(self.np_random.integers(2**63)))
        return self.grammar.admissible_for_state(state) or []

    def _record(self, state: str, action: str, next_state: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        truncated = not done and self.steps >= self.max_steps
        step_info = {"invalid_action": bool(info.get("invalid_action")), **({"truncated": True} if truncated else {})}
        if "dream_failure" in info:
            step_info["dream_failure"] = info["dream_failure"]
        if info.get("recalled"):
            step_info["recalled"] = True
        self.transitions.append(
            Transition(state=state, action=action, next_state=next_state, reward=reward,
                       done=done or truncated, info=step_info)
        )

    def trajectory(self) -> Trajectory:
        """The episode so far as a synthetic trajectory."""
        assert self.task is not None
        success = bool(self.transitions and self.transitions[-1].done and self._last_info.get("success"))
        return Trajectory(traj_id=self.traj_id, task=self.task, transitions=list(self.transitions), success=success,
                          source="synthetic", policy=None, meta={"env": self.name, "dream_failures": self.dream_failures})


class DreamEnvPool(PoolHooks):
    """Many dream episodes advanced by one batched experience-model call per step (an ``EnvPool``)."""

    source: Source = "synthetic"

    def __init__(
        self, make_env: Callable[[], DreamEnv], num_envs: int, add_to_buffer: bool = True, owns_buffer: bool = False
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"a dream pool needs at least one env, got num_envs={num_envs}")
        self.envs = [make_env() for _ in range(num_envs)]
        self.model = self.envs[0].model
        self.num_envs = num_envs
        self.name = self.envs[0].name
        self.add_to_buffer = add_to_buffer
        self.owns_buffer = owns_buffer  # close the model's replay buffer with the pool
        self.iteration = -1  # set by the trainer; tags the synthetic transitions in the buffer
        self.finished: list[Trajectory] = []  # synthetic trajectories of episodes that ended (drained by the caller)

    def tasks(self, split: str) -> list[Task]:
        return self.envs[0].tasks(split)

    def reset_batch(
        self, indices: Sequence[int], tasks: Sequence[Task], seeds: Sequence[int], split: str
    ) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for i, task, seed in zip(indices, tasks, seeds, strict=True):
            obs, info = self.envs[i].reset(seed=seed, options={"task": task, "split": split})
            out.append((obs, info_essentials(info)))
        return out

    def step_batch(self, indices: Sequence[int], actions: Sequence[str]) -> list[StepResult]:
        queries = [self.envs[i].query_for(a) for i, a in zip(indices, actions, strict=True)]
        asked = [(i, q) for i, q in zip(indices, queries, strict=True) if q is not None]
        predictions = self.model.predict([q for _, q in asked])
        for (i, _), prediction in zip(asked, predictions, strict=True):
            self.envs[i].set_prediction(prediction)
        results, ended = [], []
        for i, action in zip(indices, actions, strict=True):
            obs, reward, terminated, truncated, info = self.envs[i].step(action)
            results.append(StepResult(obs, reward, terminated, truncated, info_essentials(info)))
            if terminated or truncated:
                ended.append(self.envs[i].trajectory())
        if ended:
            self.finished.extend(ended)
            if self.add_to_buffer and self.model.buffer is not None:
                self.model.buffer.add_trajectories(ended, iteration=self.iteration)
        return results

    def close(self) -> None:
        for env in self.envs:
            env.close()
        if self.owns_buffer and self.model.buffer is not None:
            self.model.buffer.close()

    # -- pool hooks ---------------------------------------------------------------------------------
    @property
    def task_generator_llm(self) -> Any:
        return self.model.llm  # the paper's M_task shares the experience model's weights

    @property
    def encoder(self) -> Any:
        return self.model.buffer.encoder if self.model.buffer is not None else None

    def on_iteration_start(self, iteration: int) -> None:
        self.iteration = iteration

    def checkpoint_state(self) -> dict[str, Any]:
        """The replay buffer's size at the checkpoint (``buffer_rows``; rows past it are a killed run's)."""
        if self.model.buffer is None:
            return {}
        self.model.buffer.flush()
        return {"buffer_rows": len(self.model.buffer)}

    def load_checkpoint_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Hide the synthetic transitions that killed attempts wrote after the checkpoint: the resumed run redoes
        that work. The ``[start, stop)`` row ranges (``hidden_rows``) are checkpointed, in case of another kill."""
        buffer, rows = self.model.buffer, state.get("buffer_rows")
        if buffer is None or rows is None:
            return {}
        hidden = [list(r) for r in state.get("hidden_rows", [])]
        if len(buffer) > rows:
            hidden.append([rows, len(buffer)])
            log.warning("replay buffer: %d rows written after the checkpoint are hidden", len(buffer) - rows)
        for start, stop in hidden:
            buffer.hide_rows(start, stop)
        return {"hidden_rows": hidden}

    def report(self) -> dict[str, Any]:
        return {"experience_model": self.model.stats_dict()}


# ------------------------------------------------------------------------------------------- configuration


class DreamConfig(BaseModel):
    """What the trainer needs to roll out in the dream instead of the real env (``RLConfig.dream``)."""

    model_config = ConfigDict(extra="forbid")

    experience_model: str = Field(description="an experience-model dir (train-exp output) with experience.json")
    buffer: str | None = Field(default=None, description="replay buffer dir (seeded with offline data if new)")
    encoder: str = Field(default="hashing", description="buffer encoder for a new buffer: hashing | minilm")
    offline_data: list[str] = Field(default_factory=list, description="real trajectories: initial states, seeding")
    max_new_tokens: int | None = Field(default=None, ge=8, description="override experience.json")
    temperature: float | None = Field(default=None, ge=0, description="override experience.json")
    unique_elements: bool | None = Field(default=None, description="override experience.json: a dreamt page that "
                                         "lists one element twice is malformed (ExperienceConfig.unique_elements)")
    computed_premises: bool | None = Field(default=None, description="override experience.json: the env writes the "
                                           "start of each trace it can compute from the query, the model the rest "
                                           "(ProtocolConfig.computed_premises; its traces must start that way)")
    checked_verdicts: bool | None = Field(default=None, description="override experience.json: the env recomputes "
                                          "the verdicts that follow from what each trace compares (the shop: a "
                                          "purchase's checks; TextWorld: a meal with an ingredient missing is "
                                          "refused; a win other than eating a carried meal, or a meal from a "
                                          "step other than prepare meal or take meal, resampled; "
                                          "ProtocolConfig.checked_verdicts)")
    recall: bool = Field(default=False, description="a step the offline data recorded (the same task, state and "
                         "action) is answered as the real env answered it, not generated: the memory of its "
                         "training data that an LLM M_exp has and the 1.3M one lacks (dreamgym.experience.recall); "
                         "counted (recalled) and marked in the step's info")
    recall_effects: bool = Field(default=False, description="with recall, a step the offline data took in the same "
                                 "task from another state is answered by the env's rule for what the action shows "
                                 "(TextEnv.recorded_effect; TextWorld: opening a container shows what it holds), "
                                 "where the rule can say; counted (recalled_effects)")
    device: str = "cpu"

    @model_validator(mode="after")
    def _effects_need_recall(self) -> DreamConfig:
        if self.recall_effects and not self.recall:
            raise ValueError("recall_effects answers through recall: set recall too")
        return self


def load_dream(cfg: DreamConfig, env: str, env_kwargs: dict[str, Any], read_only: bool = False
               ) -> tuple[ExperienceModel, TextEnv, InitialStates]:
    """M_exp (+ its buffer, seeded with the offline data when it is empty and writable), the real env ``env`` as
    the action grammar, and the initial states of the offline data."""
    from dreamgym.envs import make
    from dreamgym.replay import ReplayBuffer, make_encoder
    from dreamgym.types import read_trajectories

    offline = [t for path in cfg.offline_data for t in read_trajectories(path)]
    if not offline:
        raise ValueError("dream: offline_data must name at least one real trajectory file (for initial states)")
    buffer = None
    if cfg.buffer is not None:
        if read_only:
            buffer = ReplayBuffer.open(cfg.buffer, create=False, read_only=True)
        else:
            buffer = ReplayBuffer.open(cfg.buffer, encoder=None if Path(cfg.buffer, "meta.json").exists()
                                       else make_encoder(cfg.encoder))
            if len(buffer) == 0:
                buffer.add_trajectories(offline, iteration=-1)
    exp_cfg = read_experience_config(cfg.experience_model)
    overrides: dict[str, Any] = {k: v for k, v in (("max_new_tokens", cfg.max_new_tokens),
                                                   ("temperature", cfg.temperature),
                                                   ("unique_elements", cfg.unique_elements)) if v is not None}
    protocol = {k: v for k, v in (("computed_premises", cfg.computed_premises),
                                  ("checked_verdicts", cfg.checked_verdicts)) if v is not None}
    if protocol:
        exp_cfg = exp_cfg.with_protocol(**protocol)
    model = ExperienceModel.load(cfg.experience_model, buffer=buffer, cfg=exp_cfg.model_copy(update=overrides),
                                 device=cfg.device)
    real = make(env, **env_kwargs)
    if cfg.recall_effects and type(real).recorded_effect is TextEnv.recorded_effect:
        raise ValueError(f"dream: recall_effects needs an env with a recorded_effect; {env!r} has none")
    model.recall = Recall.of(offline, real.recorded_effect if cfg.recall_effects else None) if cfg.recall else None
    return model, real, InitialStates.from_trajectories(offline)


def open_dream(cfg: DreamConfig, env: str, env_kwargs: dict[str, Any], max_steps: int,
               tasks: dict[str, list[Task]], num_envs: int) -> DreamEnvPool:
    """Load M_exp (+ buffer, seeded with the offline data when it is empty) and make a pool of dream envs
    that use the real env ``env`` only as the action grammar."""
    model, grammar, initial = load_dream(cfg, env, env_kwargs)
    return DreamEnvPool(lambda: DreamEnv(model, tasks, initial, grammar=grammar, max_steps=max_steps), num_envs,
                        owns_buffer=True)


_LOADED: dict[str, tuple[ExperienceModel, TextEnv, InitialStates]] = {}


def make_dream_env(env: str = "shop", env_kwargs: dict[str, Any] | None = None, max_steps: int = 15,
                   **dream: Any) -> DreamEnv:
    """``dreamgym.make("dream", experience_model=DIR, offline_data=[FILE], env="shop", ...)``: one dream env, so
    that everything that takes a registered env takes the dream, e.g. ``dreamgym env serve dream`` (the AgentGym
    protocol, the way into AgentGym-RL) or the SkyRL adapter. ``dream``: :class:`DreamConfig` fields. Its tasks
    are the real env's; its buffer (if any) is only read. Envs made with the same arguments share one loaded
    M_exp (a server's sessions do)."""
    import json

    if isinstance(dream.get("offline_data"), str):
        dream["offline_data"] = [dream["offline_data"]]
    cfg = DreamConfig(**dream)
    key = json.dumps([cfg.model_dump(), env, env_kwargs or {}], sort_keys=True, default=str)
    if key not in _LOADED:
        _LOADED[key] = load_dream(cfg, env, dict(env_kwargs or {}), read_only=True)
    model, grammar, initial = _LOADED[key]
    tasks = {split: grammar.tasks(split) for split in ("train", "test")}
    return DreamEnv(model, tasks, initial, grammar=grammar, max_steps=max_steps)
