"""The text-environment protocol every dreamgym environment speaks (real ones and the dream alike).

Gymnasium semantics with text observations and text actions:

* ``reset(seed=None, options={"task": Task | task_id | None, "split": "train"|"val"|"test"}) -> (obs, info)``
* ``step(action: str) -> (obs, reward, terminated, truncated, info)``

``info`` always carries ``admissible_actions`` (list[str]), ``success`` (bool), ``invalid_action`` (bool),
``no_effect`` (bool: a valid step that changed nothing but its feedback, where the env can tell; see
:meth:`TextEnv.had_effect`) and ``task`` (the :class:`~dreamgym.types.Task` being played). Observations are
*abstract states*: one actionable element per line, ``[id] type: text`` (see :func:`format_elements`),
optionally preceded by a short header line. An invalid or malformed action never raises: the state stays, the
reward is 0 and ``info["invalid_action"]`` is True.
"""

from __future__ import annotations

import importlib
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import gymnasium as gym

from dreamgym.types import Task

# The task splits a user picks from (CLI ``--split``, ``RLConfig.train_split``/``eval_split``): train to learn
# on, val for every choice of settings, test for the final tables only.
Split = Literal["train", "val", "test"]
SPLITS: tuple[str, ...] = get_args(Split)


def check_split(split: str) -> str:
    """``split`` when it is one of :data:`SPLITS`, else a one-line ``ValueError`` naming them."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {' | '.join(SPLITS)}")
    return split


# Text spaces: Gymnasium's Text space needs a charset; we accept any printable text up to a length.
MAX_TEXT = 1 << 16


def text_space() -> gym.spaces.Text:
    """Observations and actions as Gymnasium text: ASCII, Latin-1 letters and signs (é, °, ×, £), general
    punctuation (— ’ “ ” …, the "…" the state mappers truncate with) and currency signs (€)."""
    import string

    extra = [chr(c) for c in (*range(0xA0, 0x100), *range(0x2010, 0x205F), *range(0x20A0, 0x20C1))]
    return gym.spaces.Text(max_length=MAX_TEXT, min_length=0, charset=string.printable + "".join(extra))


# The one shape of an element line, as ``Element.render`` writes it; a line of any other shape is not an element.
_ELEMENT_LINE = re.compile(r"^\[([^\]\n]+)\] ([^:\n]+): ?(.*)$")
TRUNCATION_MARK = "…"


@dataclass(frozen=True)
class Element:
    """One actionable (or informative) element of an abstract state: ``[id] type: text``."""

    id: str
    type: str
    text: str

    def render(self) -> str:
        return f"[{self.id}] {self.type}: {self.text}"

    @classmethod
    def parse(cls, line: str) -> Element | None:
        """The element a line renders (surrounding whitespace ignored), or None when it is not one."""
        match = _ELEMENT_LINE.match(line.strip())
        return cls(*match.groups()) if match else None


def format_elements(elements: Sequence[Element], header: str | None = None) -> str:
    lines = [header] if header else []
    lines.extend(e.render() for e in elements)
    return "\n".join(lines)


def parse_elements(state: str) -> list[Element]:
    """The elements of an abstract state, in order (header and other lines skipped)."""
    return [e for e in map(Element.parse, state.splitlines()) if e is not None]


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending with :data:`TRUNCATION_MARK` when it was cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)].rstrip() + TRUNCATION_MARK


@runtime_checkable
class StateMapper(Protocol):
    """Turns a real observation (HTML, a page object, a game's text) into the abstract textual state."""

    def __call__(self, observation: Any, info: dict[str, Any]) -> str: ...


class TextEnv(gym.Env[str, str]):
    """Base class of dreamgym environments. Subclasses implement ``_reset`` and ``_step``, and may override
    ``tasks``, ``admissible_for_state`` and ``scripted_policy``; set the class attribute ``name``.

    * ``tasks(split)`` lists the env's own tasks (``"train"``, ``"val"``, ``"test"``; may be empty for an env
      that makes tasks on the fly). ``reset`` picks one at random when the caller gives none.
    * ``_reset(task, split)`` starts an episode of ``task`` and must set ``self.task`` to the
      :class:`~dreamgym.types.Task` being played (build one when ``task`` is None); it returns ``(obs, info)``,
      with ``info["admissible_actions"]`` when the env has a list of actions. The base class fills the other
      ``info`` keys from ``self.task`` and ``self.steps``.
    * ``_step(action)`` returns ``(obs, reward, terminated, info)``; the base class counts steps and truncates
      at ``max_steps``. An invalid action returns the same state, reward 0 and ``info["invalid_action"] = True``.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"]}  # noqa: RUF012 (gymnasium declares it an instance var)
    name: str = "text"

    def __init__(self, max_steps: int = 15) -> None:
        super().__init__()
        self.observation_space = text_space()
        self.action_space = text_space()
        self.max_steps = max_steps
        self.steps = 0
        self.task: Task | None = None
        self._last_obs = ""
        self._last_info: dict[str, Any] = {}
        self.make_kwargs: dict[str, Any] = {}
        self.env_spec: EnvSpec | None = None  # set by make()

    # -- to implement -----------------------------------------------------------------------------
    def tasks(self, split: str = "train") -> list[Task]:
        return []

    def _reset(self, task: Task | None, split: str) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Return ``(obs, reward, terminated, info)``; the base class adds truncation and bookkeeping."""
        raise NotImplementedError

    # -- Gymnasium API ----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        split = str(options.get("split", "train"))
        task = options.get("task")
        if isinstance(task, str):
            task = self.get_task(task)
        elif isinstance(task, dict):
            task = Task.model_validate(task)
        if task is None:
            pool = self.tasks(split)
            if pool:
                task = pool[int(self.np_random.integers(len(pool)))]
        self.steps = 0
        obs, info = self._reset(task, split)
        if not isinstance(info.get("task", self.task), Task):
            raise TypeError(f"{type(self).__name__}._reset must set self.task to the Task being played "
                            f"(it is {type(self.task).__name__})")
        info = self._fill_info(info)
        self._last_obs, self._last_info = obs, info
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None and not self._last_info:
            raise RuntimeError("step() called before reset()")
        self.steps += 1
        state = self._last_obs
        obs, reward, terminated, info = self._step(str(action))
        if "no_effect" not in info and not terminated and not info.get("invalid_action"):
            info["no_effect"] = self.had_effect(state, obs) is False
        info = self._fill_info(info)
        truncated = (not terminated) and self.steps >= self.max_steps
        self._last_obs, self._last_info = obs, info
        return obs, float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str:
        """The current observation as text (the ``ansi`` render mode, the only one)."""
        return self._last_obs

    @property
    def observation(self) -> str:
        return self._last_obs

    @property
    def last_info(self) -> dict[str, Any]:
        return self._last_info

    def get_task(self, task_id: str) -> Task:
        for split in SPLITS:
            try:
                pool = self.tasks(split)
            except ValueError:  # an env without this split (e.g. the shop's val when it is off)
                if split in ("train", "test"):
                    raise
                continue
            for t in pool:
                if t.task_id == task_id:
                    return t
        raise KeyError(f"unknown task id {task_id!r} for env {self.name!r}")

    def _fill_info(self, info: dict[str, Any]) -> dict[str, Any]:
        info.setdefault("admissible_actions", [])
        info.setdefault("success", False)
        info.setdefault("invalid_action", False)
        info.setdefault("no_effect", False)
        info.setdefault("task", self.task)
        info.setdefault("steps", self.steps)
        return info

    # -- the action grammar of abstract states (the dream env asks the real env) ------------------
    def admissible_for_state(self, state: str) -> list[str] | None:
        """The admissible actions of an abstract state of this env (None: this env cannot tell from text).

        The dream env uses it to show the policy its options and to reject invalid actions itself, exactly
        as the real env would, instead of asking the experience model.
        """
        return None

    def action_valid_for_state(self, state: str, action: str) -> bool | None:
        """Whether ``action`` is valid in ``state`` (None: cannot tell). Default: it is admissible."""
        actions = self.admissible_for_state(state)
        return None if actions is None else action.strip().lower() in {a.lower() for a in actions}

    def had_effect(self, state: str, next_state: str) -> bool | None:
        """Whether a valid step from ``state`` to ``next_state`` changed the world, read from the two abstract
        states (None: this env cannot tell). :meth:`step` reports a False as ``info["no_effect"]``, which RL may
        penalise (``RLConfig.no_effect_penalty``): a command the env accepts and then refuses, like TextWorld's
        ``prepare meal`` with an ingredient missing, is valid, so the invalid-action penalty never sees it. The
        dream env asks its real env, as it does for admissible actions."""
        return None

    def recorded_effect(self, state: str, action: str, recorded_state: str, recorded_next_state: str) -> str | None:
        """The abstract state this env shows for ``action`` from ``state``, carried over from a real step of the same
        task that took ``action`` from ``recorded_state`` to ``recorded_next_state``, for actions whose effect the
        difference of the two states does not change (TextWorld: opening a container shows what it holds), None
        where the env cannot say. The dream's recall answers such steps with it (``DreamConfig.recall_effects``)."""
        return None

    # -- scripted policies ------------------------------------------------------------------------
    def scripted_policy(self, name: str, seed: int = 0, **kwargs: Any) -> ScriptedPolicy:
        """A scripted policy for this env by name, from its :class:`EnvSpec`'s ``policies`` (the spec it was
        made with, else the one registered under :attr:`name`). ``random`` is available everywhere."""
        env_spec = getattr(self, "env_spec", None) or _REGISTRY.get(self.name)
        factory = env_spec.load("policies") if env_spec is not None else None
        if factory is not None:
            policy: ScriptedPolicy = factory(name, seed=seed, **kwargs)
            return policy
        if name == "random":
            return RandomPolicy(seed=seed)
        raise ValueError(f"env {self.name!r} has no scripted policy {name!r} (has: random)")


class ScriptedPolicy(Protocol):
    """A non-learned policy used to collect offline data or as a reference (oracle, random, noisy)."""

    name: str

    def reset(self, env: TextEnv, task: Task | None) -> None: ...

    def act(self, obs: str, info: dict[str, Any]) -> str: ...


class RandomPolicy:
    """Uniform over the admissible actions (falls back to a no-op string when there are none)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def reset(self, env: TextEnv, task: Task | None) -> None:
        pass

    def act(self, obs: str, info: dict[str, Any]) -> str:
        actions = info.get("admissible_actions") or []
        return self.rng.choice(actions) if actions else "noop"


# ------------------------------------------------------------------------------------------ registry

EnvFactory = Callable[..., TextEnv]
# A lazy reference "package.module:attr" (imported on first use, so registering costs nothing) or the object.
Ref = str | Callable[..., Any]


@dataclass(frozen=True)
class EnvSpec:
    """Everything dreamgym knows about one env, as Gymnasium's ``EnvSpec`` is for its envs.

    Only ``entry_point`` is required; every other field is optional, and each says what happens without it:

    * ``policies``: ``(name, seed=, **kwargs) -> ScriptedPolicy``, the env's scripted policies by name (an
      ``oracle`` and a ``noisy`` one make offline data). Without it only ``random`` exists, and the demo collects
      its offline data with ``random`` (or takes the user's own file, ``DemoConfig.offline_file``).
    * ``explainer``: ``Trajectory -> Explanation``, reasoning traces from the env's ground truth (the ``rule``
      annotator). Without it the demo annotates with ``diff`` (:mod:`dreamgym.envs.explain_diff`).
    * ``consistency_checks``: code-judged checks of dreamt steps for the fidelity report (the shop: click,
      option and reward consistency). Without it the report has the generic metrics only.
    * ``variation_operator``: a class or factory taking the env's kwargs, the ``rule`` task generator of the
      curriculum. Without it the demo's task generator is ``none`` (the ``llm`` generator needs no env code).
    * ``page_type``: ``state -> str``, a page kind for per-page next-state F1 and for weighting M_exp's data
      (``exp_mixture``). Without it every state is one kind, ``"state"``.
    * ``decision_step``: ``(state, action, admissible_actions) -> bool``, the steps where the agent picks, among
      alternatives, the one the task decides (the shop: one of an item page's two or more options). Behaviour
      cloning can repeat them (``train_bc(decision_repeat=K)``, ``DemoConfig.bc_decision_repeat``). Without it
      no step is one, and every step is cloned once.
    * ``trace_checker``: ``(state, action, ExperiencePrediction) -> ExperiencePrediction | None``, the dreamt
      prediction with the verdicts of its reasoning trace recomputed from the text the trace compares (the shop:
      a purchase's checks, score and reward; :mod:`dreamgym.envs.shop.recheck`; TextWorld: a ``prepare meal`` whose
      trace leaves an ingredient missing is refused, a win other than eating a carried meal rejected;
      :mod:`dreamgym.envs.textworld.recheck`), None where it checks nothing. A prediction returned with ``failure``
      set is rejected: M_exp resamples it, then serves the failure state.
      Used by M_exp with ``ProtocolConfig.checked_verdicts``. Without it the model's verdicts stand.
    * ``trace_premise``: ``(instruction, state, action) -> str | None``, the start of a step's reasoning trace that
      the env's ``explainer`` computes from the query alone (TextWorld: which recipe ingredients are carried and
      which are missing), None where there is none. Used by M_exp with ``ProtocolConfig.computed_premises``: the
      model writes its trace on from it. Without it the model writes the whole trace.
    * ``demo_defaults``: :class:`~dreamgym.pipeline.DemoConfig` fields this env needs when a config does not
      give them (e.g. its constructor's ``env_kwargs``).
    """

    name: str
    entry_point: Ref
    policies: Ref | None = None
    explainer: Ref | None = None
    consistency_checks: Ref | None = None
    variation_operator: Ref | None = None
    page_type: Ref | None = None
    decision_step: Ref | None = None
    trace_checker: Ref | None = None
    trace_premise: Ref | None = None
    demo_defaults: Mapping[str, Any] = field(default_factory=dict)

    def load(self, what: str) -> Any:
        """The object behind field ``what`` (importing a ``"module:attr"`` string), or None when not given."""
        ref = getattr(self, what)
        if not isinstance(ref, str):
            return ref
        module, _, attr = ref.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"env {self.name!r}: cannot load its {what} {ref!r}: {e}") from e


_REGISTRY: dict[str, EnvSpec] = {}


def register(name: str, entry_point: Ref, **fields: Any) -> EnvSpec:
    """Register an env: ``register("myenv", "mypkg.env:MyEnv", policies="mypkg.policies:make_policy")``.

    ``entry_point`` is a factory or a lazy ``"module:attr"`` string; ``fields`` are the optional
    :class:`EnvSpec` fields. Registering a name again replaces its spec. Also registers the env with Gymnasium
    as ``dreamgym/<name>-v0``, so ``gymnasium.make`` works too.
    """
    try:
        env_spec = EnvSpec(name=name, entry_point=entry_point, **fields)
    except TypeError as e:
        raise TypeError(f"register({name!r}): {e}; EnvSpec fields are {', '.join(EnvSpec.__dataclass_fields__)}") \
            from None
    _REGISTRY[name] = env_spec
    gym_id = f"dreamgym/{name}-v0"
    if gym_id not in gym.registry:
        gym.register(id=gym_id, entry_point=_gymnasium_creator(name), disable_env_checker=True)
    return env_spec


def _gymnasium_creator(name: str) -> Callable[..., TextEnv]:
    """What ``gymnasium.make("dreamgym/<name>-v0", render_mode=..., **kwargs)`` calls: :func:`make` (so the
    kwargs are recorded in trajectories like any other), with Gymnasium's ``render_mode`` checked and set."""

    def create(render_mode: str | None = None, **kwargs: Any) -> TextEnv:
        env = make(name, **kwargs)
        if render_mode is not None and render_mode not in env.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r}: {name} renders {env.metadata['render_modes']}")
        env.render_mode = render_mode
        return env

    create.metadata = TextEnv.metadata  # type: ignore[attr-defined]  # read by gymnasium.make
    return create


def registered() -> list[str]:
    return sorted(_REGISTRY)


def spec(name: str) -> EnvSpec:
    """The registered :class:`EnvSpec` of ``name`` (a ``ValueError`` naming the registered envs if none)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown env {name!r}; registered: {', '.join(registered()) or 'none'} "
                         "(a user's env: --import MODULE, or a 'dreamgym.envs' entry point)")
    return _REGISTRY[name]


def find_spec(name: str) -> EnvSpec | None:
    """The :class:`EnvSpec` of ``name``, or None when no env of that name is registered."""
    return _REGISTRY.get(name)


def one_page_type(state: str) -> str:
    """The page type of an env that has none: every state is one kind."""
    return "state"


def page_type_of(env: str) -> Callable[[str], str]:
    """``env``'s :attr:`EnvSpec.page_type`, or :func:`one_page_type` when it has none or is not registered."""
    env_spec = find_spec(env)
    page_type = env_spec.load("page_type") if env_spec is not None else None
    return page_type or one_page_type


def make(name: str, **kwargs: Any) -> TextEnv:
    """Create a registered environment: ``make("shop", num_products=1000)``."""
    env_spec = spec(name)
    factory = env_spec.load("entry_point")
    env = factory(**kwargs)
    if not isinstance(env, TextEnv):
        raise TypeError(f"entry point for {name!r} returned {type(env).__name__}, not a TextEnv")
    env.make_kwargs = dict(kwargs)  # recorded in trajectories so the same env can be rebuilt
    env.env_spec = env_spec
    return env
