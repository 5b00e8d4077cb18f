"""The verl-agent environment manager over dreamgym envs, exercised the way verl-agent's rollout loop calls it
(reset, then step with a batch of LLM outputs until every env is done); verl itself is not needed."""

from __future__ import annotations

import numpy as np

from dreamgym.adapters.verl_agent import DreamgymEnvManager, DreamgymVecEnv
from dreamgym.agent.policy import PolicyConfig


def test_oracle_outputs_win_every_group_and_groups_share_their_start() -> None:
    vec = DreamgymVecEnv("shop", env_num=2, group_n=3, split="test", seed=0, env_kwargs={"num_products": 100},
                         policy=PolicyConfig(action_format="text"))
    manager = DreamgymEnvManager(vec)
    obs, infos = manager.reset({})
    assert len(obs["text"]) == len(obs["anchor"]) == len(infos) == 6
    for g in range(2):  # one task and one initial state per group
        assert len({infos[i]["task_id"] for i in range(3 * g, 3 * g + 3)}) == 1
        assert len({obs["anchor"][i] for i in range(3 * g, 3 * g + 3)}) == 1
    assert "TASK:" in obs["text"][0] and "STATE:" in obs["text"][0]
    oracles = []
    for env in vec.envs:
        oracle = env.scripted_policy("oracle")
        oracle.reset(env, env.last_info["task"])
        oracles.append(oracle)
    rewards_total = np.zeros(6)
    for _ in range(15):
        texts = [f"<action>{o.act(vec.obs[i], vec.infos[i])}</action>" if not vec.done[i] else "" for i, o in
                 enumerate(oracles)]
        obs, rewards, dones, infos = manager.step(texts)
        rewards_total += rewards
        assert rewards.dtype == np.float32 and dones.shape == (6,)
        if dones.all():
            break
    assert dones.all() and rewards_total.tolist() == [1.0] * 6
    assert all(info["won"] and info["is_action_valid"] for info in infos)
    assert manager.success_evaluator()["success_rate"].tolist() == [1.0] * 6
    manager.close()


def test_an_unparsable_output_is_an_invalid_action() -> None:
    vec = DreamgymVecEnv("shop", env_num=1, group_n=2, env_kwargs={"num_products": 100},
                         policy=PolicyConfig(action_format="index"))
    manager = DreamgymEnvManager(vec)
    manager.reset({})
    _, rewards, dones, infos = manager.step(["no idea", "<action>1</action>"])  # index format: option 1
    assert not infos[0]["is_action_valid"] and infos[1]["is_action_valid"]
    assert rewards.tolist() == [0.0, 0.0] and not dones.any()
