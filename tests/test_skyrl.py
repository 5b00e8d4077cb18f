"""dreamgym envs, real and dream, through SkyRL-gym's own API (``skyrl_gym.make``, ``init``, ``step``)."""

from __future__ import annotations

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")

from dreamgym.adapters.skyrl import DreamgymTextEnv, register_skyrl  # noqa: E402
from dreamgym.envs import make  # noqa: E402

SHOP = {"name": "shop", "kwargs": {"num_products": 100}}


@pytest.fixture(scope="module", autouse=True)
def registered() -> None:
    register_skyrl("dreamgym-test")


def play_oracle(env: DreamgymTextEnv, index: bool) -> tuple[list[float], list[dict], object]:
    """Drive the env with the shop oracle's actions written as LLM outputs."""
    conversation, meta = env.init([{"role": "user", "content": "ignored"}])
    oracle = env.env.scripted_policy("oracle")
    oracle.reset(env.env, env._info["task"])
    rewards, metas = [], []
    while True:
        action = oracle.act(env._obs, env._info)
        options = [line.split(" ", 1)[1] for line in conversation[-1]["content"].split("ACTIONS:\n", 1)[1].splitlines()] \
            if index else []
        text = f"<think>go</think><action>{options.index(action) + 1 if index else action}</action>"
        out = env.step(text)
        rewards.append(out["reward"])
        metas.append(out["metadata"])
        assert out["postprocessed_action"] == action
        if out["done"]:
            assert out["observations"] == []
            return rewards, metas, env.get_metrics()
        assert out["observations"][0]["role"] == "user" and "STATE:" in out["observations"][0]["content"]
        conversation = conversation + [{"role": "assistant", "content": text}] + out["observations"]


@pytest.mark.parametrize("index", [False, True])
def test_the_real_shop_through_skyrl_make(index: bool) -> None:
    shop = make("shop", num_products=100)
    task = shop.tasks("test")[0]
    env = skyrl_gym.make("dreamgym-test", env_config={**SHOP, "policy": {"action_format": "index" if index else "text",
                                                                    "offer_task_search": True}},
                         extras={"task_id": task.task_id, "split": "test", "max_turns": 15})
    assert isinstance(env, DreamgymTextEnv)
    rewards, metas, metrics = play_oracle(env, index)
    assert rewards[-1] == 1.0 and sum(rewards[:-1]) == 0.0  # the shop pays the purchase only
    assert metrics == {"success": 1.0, "invalid_actions": 0, "turns": len(rewards)}
    assert all(m["source"] == "real" for m in metas)


def test_an_unparsable_output_is_an_invalid_step_and_max_turns_ends_the_episode() -> None:
    env = skyrl_gym.make("dreamgym-test", env_config=SHOP, extras={"split": "test", "seed": 0, "max_turns": 2})
    env.init([])
    first = env.step("I am not sure what to do")
    assert first["reward"] == 0.0 and not first["done"] and first["metadata"]["invalid_action"]
    second = env.step("<action>click[nothing here]</action>")
    assert second["done"] and second["metadata"]["invalid_action"]
    assert env.get_metrics()["invalid_actions"] == 2


def test_the_dream_through_skyrl() -> None:
    """A DreamEnv (M_exp answering) behind the same API: the purchase is dreamt, not played."""
    from test_dream import ShopScriptLLM, dream_env

    from dreamgym.collect import iter_episodes

    shop = make("shop", num_products=100)
    offline = list(iter_episodes(shop, shop.scripted_policy("noisy", seed=0), 20, split="train", seed=0))
    llm = ShopScriptLLM()
    dream = dream_env(shop, offline, llm)
    task = dream.tasks("train")[0]
    env = skyrl_gym.make("dreamgym-test", extras={"env": dream, "task_id": task.task_id, "split": "train"})
    conversation, _ = env.init([])
    assert task.instruction in conversation[-1]["content"]
    clicked = env.step(f"<action>{env._info['admissible_actions'][-1]}</action>")  # any click: an item page
    assert not clicked["done"] and clicked["metadata"]["source"] == "synthetic"
    assert "Buy Now" in clicked["observations"][0]["content"]
    bought = env.step("<action>click[buy now]</action>")
    assert bought["done"] and bought["reward"] == 1.0 and env.get_metrics()["success"] == 1.0
    assert llm.calls  # the experience model answered


def test_bad_configs_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="env_config\\['name'\\]"):
        DreamgymTextEnv({}, {})
    with pytest.raises(TypeError, match="must be a dreamgym TextEnv"):
        DreamgymTextEnv(None, {"env": object()})
