"""Any dreamgym env, real or dream, as a SkyRL-gym ``BaseTextEnv`` (``pip install dreamgym[skyrl]``).

SkyRL's generator keeps the conversation and calls ``init(prompt)`` once, then ``step(llm_output)`` per turn.
Here ``init`` resets the dreamgym env and answers with dreamgym's agent prompt (system + TASK / STEP / HISTORY /
STATE / numbered ACTIONS, :func:`dreamgym.agent.policy.build_agent_prompt`), and every ``step`` parses the LLM's
``<action>…</action>`` the way :class:`~dreamgym.agent.policy.LLMPolicy` does (an option number in ``index``
format), steps the env and returns the next state as the next user message. So a policy trained here sees the
same prompts as one trained by ``dreamgym train``.

Register it under SkyRL's registry and make it with SkyRL's own ``make``::

    import skyrl_gym
    from dreamgym.adapters.skyrl import register_skyrl
    register_skyrl()                                        # id "dreamgym"
    env = skyrl_gym.make("dreamgym", env_config={"name": "shop", "kwargs": {"num_products": 1000}},
                         extras={"task_id": "shop-test-00000", "split": "test", "max_turns": 15})

``env_config``: ``name`` and ``kwargs`` (for :func:`dreamgym.make`) and ``policy`` (:class:`PolicyConfig`
fields of the prompt: ``action_format``, ``history_window``, ...). ``extras``: ``task_id``, ``split``, ``seed``,
``max_turns``; or ``env``: an already built :class:`~dreamgym.envs.TextEnv`, e.g. a
:class:`~dreamgym.experience.dream.DreamEnv`, to train in the dream.
"""

from __future__ import annotations

from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from dreamgym.agent.policy import AgentObservation, PolicyConfig, build_agent_prompt, env_action
from dreamgym.envs import TextEnv, make


class DreamgymTextEnv(BaseTextEnv):
    """A dreamgym env behind SkyRL-gym's text-env API (see the module docstring)."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        config = dict(env_config or {})
        extras = dict(extras or {})
        given = extras.get("env")
        if given is not None and not isinstance(given, TextEnv):
            raise TypeError(f"extras['env'] must be a dreamgym TextEnv, got {type(given).__name__}")
        if given is None and "name" not in config:
            raise ValueError("DreamgymTextEnv: give env_config['name'] (a registered dreamgym env) or extras['env']")
        self.env: TextEnv = given if given is not None else make(str(config["name"]), **dict(config.get("kwargs") or {}))
        self.policy_cfg = PolicyConfig(**dict(config.get("policy") or {}))
        self.task_id: str | None = extras.get("task_id")
        self.split = str(extras.get("split", "train"))
        self.seed: int | None = extras.get("seed")
        self.max_turns = int(extras.get("max_turns", self.env.max_steps))
        self.history: list[tuple[str, str]] = []
        self.success = False
        self.invalid_actions = 0
        self._obs = ""
        self._info: dict[str, Any] = {}

    def _observation(self) -> AgentObservation:
        task = self._info["task"]
        return AgentObservation(task.instruction, self._obs, self._info.get("admissible_actions") or [],
                                list(self.history))

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Reset the env (``prompt``, the dataset's, is replaced by dreamgym's agent prompt)."""
        self._obs, self._info = self.env.reset(seed=self.seed, options={"task": self.task_id, "split": self.split})
        self.turns, self.history, self.success, self.invalid_actions = 0, [], False, 0
        return build_agent_prompt(self._observation(), self.policy_cfg), {"task_id": self._info["task"].task_id}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        chosen = env_action(action, self._observation(), self.policy_cfg)
        obs, reward, terminated, truncated, info = self.env.step(chosen or "")  # "" is an invalid action
        self.history.append((self._obs, chosen or ""))
        self._obs, self._info = obs, info
        self.success = bool(info.get("success"))
        self.invalid_actions += bool(info.get("invalid_action"))
        done = terminated or truncated or self.turns >= self.max_turns
        next_prompt = [] if done else [build_agent_prompt(self._observation(), self.policy_cfg)[-1]]
        return BaseTextEnvStepOutput(
            observations=next_prompt, reward=float(reward), done=done, postprocessed_action=chosen,
            metadata={"success": self.success, "invalid_action": bool(info.get("invalid_action")),
                      "action": chosen, "source": getattr(self.env, "source", "real")})

    def get_metrics(self) -> dict[str, Any]:
        return {"success": float(self.success), "invalid_actions": self.invalid_actions, "turns": self.turns}

    def close(self) -> None:
        self.env.close()


def register_skyrl(env_id: str = "dreamgym") -> None:
    """Register :class:`DreamgymTextEnv` in SkyRL-gym's registry under ``env_id``."""
    import skyrl_gym

    skyrl_gym.register(id=env_id, entry_point="dreamgym.adapters.skyrl:DreamgymTextEnv")
