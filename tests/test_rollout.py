"""Multi-turn rollouts on the real shop with a micro policy: group structure, exact env-step counts, loss
masks on the policy's tokens only, behaviour log-probs reproduced by the trainer, penalties, evaluation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from dreamgym.agent.policy import LLMPolicy, PolicyConfig
from dreamgym.collect import episode_tasks, iter_episodes
from dreamgym.envs import make
from dreamgym.envs.pool import EnvPool, LocalEnvPool, env_factory
from dreamgym.envs.shop import ShopEnv
from dreamgym.llm.hf import HFLLM
from dreamgym.llm.tiny import init_tiny_model
from dreamgym.rl.batch import collate, turn_rows
from dreamgym.rl.evaluate import eval_tasks, evaluate_policy, run_eval_episodes
from dreamgym.rl.losses import sequence_logprobs
from dreamgym.rl.rollout import RolloutStats, collect_rollouts, count_env_steps
from dreamgym.types import read_jsonl, write_jsonl

torch.set_num_threads(1)

SHOP = {"num_products": 100}


class CountingShop(ShopEnv):
    """The real shop, counting every ``step`` call across instances."""

    steps_taken = 0

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        CountingShop.steps_taken += 1
        return super().step(action)


@pytest.fixture(scope="module")
def micro_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained micro policy with a BPE trained on shop trajectories (it mostly writes invalid actions)."""
    tmp = tmp_path_factory.mktemp("micro")
    env = make("shop", **SHOP)
    write_jsonl(tmp / "corpus.jsonl", iter_episodes(env, env.scripted_policy("noisy"), 30, seed=0))
    init_tiny_model("micro", [tmp / "corpus.jsonl"], tmp / "model", seed=0)
    return tmp / "model"


@pytest.fixture
def policy(micro_dir: Path) -> LLMPolicy:
    cfg = PolicyConfig(max_new_tokens=12, temperature=0.7, invalid_action_penalty=0.1)
    return LLMPolicy(HFLLM.from_pretrained(micro_dir), cfg)


@pytest.fixture
def pool() -> LocalEnvPool:
    return LocalEnvPool(lambda: CountingShop(**SHOP), num_envs=6)


def test_groups_turns_and_exact_env_step_count(policy: LLMPolicy, pool: LocalEnvPool) -> None:
    tasks = pool.tasks("train")[:2]
    stats = RolloutStats()
    before = CountingShop.steps_taken
    episodes = collect_rollouts(pool, policy, tasks, group_size=3, max_steps=3, seed=7, stats=stats)
    assert [e.group_id for e in episodes] == [0, 0, 0, 1, 1, 1]
    assert [e.task.task_id for e in episodes] == [tasks[0].task_id] * 3 + [tasks[1].task_id] * 3
    assert len({e.seed for e in episodes}) == 6
    for e in episodes:
        assert 1 <= e.env_steps <= 3 and e.done
        assert all(not t.done for t in e.turns[:-1])
        if not e.turns[-1].terminated:
            assert e.env_steps == 3 and e.turns[-1].truncated
    assert count_env_steps(episodes) == stats.env_steps == CountingShop.steps_taken - before
    assert stats.policy_calls == max(e.env_steps for e in episodes)  # one batched call per turn


def test_loss_mask_covers_exactly_the_response_and_logprobs_match_generation(
    policy: LLMPolicy, pool: LocalEnvPool
) -> None:
    episodes = collect_rollouts(pool, policy, pool.tasks("train")[:2], group_size=3, max_steps=3, seed=1)
    rows = turn_rows(episodes)
    assert len(rows) == count_env_steps(episodes)
    llm: Any = policy.llm
    batch = collate(rows, llm.pad_id)
    ids, mask = batch["input_ids"], batch["mask"]
    for i, row in enumerate(rows):
        assert len(row.old_logprobs) == len(row.response_ids) >= 1
        assert ids[i][mask[i] > 0].tolist() == row.response_ids  # the trained tokens are the generated ones
        assert int(mask[i].sum()) == len(row.response_ids)
        assert ids[i, : len(row.prompt_ids)].tolist() == row.prompt_ids and mask[i, : len(row.prompt_ids)].sum() == 0
    with torch.no_grad():
        logp = sequence_logprobs(llm.model, ids, batch["attention_mask"], temperature=policy.cfg.temperature)
    gap = ((logp - batch["old_logp"]).abs() * mask).max()
    assert float(gap) < 1e-4


def test_invalid_action_penalty_is_applied_to_the_rl_reward_only(policy: LLMPolicy, pool: LocalEnvPool) -> None:
    episodes = collect_rollouts(pool, policy, pool.tasks("train")[:2], group_size=2, max_steps=3, seed=3,
                                invalid_action_penalty=0.25)
    turns = [t for e in episodes for t in e.turns]
    assert any(t.invalid for t in turns)  # an untrained policy writes invalid actions
    for t in turns:
        assert t.reward == pytest.approx(t.env_reward - (0.25 if t.invalid else 0.0))
        assert (t.action == "") == (not t.parsed)
    e = episodes[0]
    assert e.shaped_return == pytest.approx(e.env_return - 0.25 * sum(t.invalid for t in e.turns))


def test_episodes_become_real_trajectories(policy: LLMPolicy, pool: LocalEnvPool, tmp_path: Path) -> None:
    episodes = collect_rollouts(pool, policy, pool.tasks("train")[:1], group_size=2, max_steps=2, seed=5)
    trajs = [e.to_trajectory(policy.name) for e in episodes]
    write_jsonl(tmp_path / "r.jsonl", trajs)
    back = list(read_jsonl(tmp_path / "r.jsonl"))
    for e, t in zip(episodes, back, strict=True):
        assert t.source == "real" and t.task == e.task and t.num_steps == e.env_steps
        assert [x.action for x in t.transitions] == [turn.action for turn in e.turns]
        assert [x.reward for x in t.transitions] == [turn.env_reward for turn in e.turns]
        assert t.transitions[0].info["admissible_actions"] == e.turns[0].admissible
        assert t.transitions[-1].done


def test_rollouts_are_seeded_and_a_small_pool_runs_every_episode(policy: LLMPolicy) -> None:
    tasks = make("shop", **SHOP).tasks("train")[:3]
    small = LocalEnvPool(env_factory("shop", **SHOP), num_envs=2)  # fewer slots than episodes
    a = collect_rollouts(small, policy, tasks, group_size=2, max_steps=3, seed=11)
    b = collect_rollouts(small, policy, tasks, group_size=2, max_steps=3, seed=11)
    assert len(a) == 6 and all(e.done for e in a)
    assert [[t.response_ids for t in e.turns] for e in a] == [[t.response_ids for t in e.turns] for e in b]


def test_greedy_eval_plays_the_scripted_eval_tasks_and_is_deterministic(policy: LLMPolicy) -> None:
    env = make("shop", **SHOP)
    pool = LocalEnvPool(env_factory("shop", **SHOP), num_envs=4)
    assert eval_tasks(pool, "test", 5, seed=3) == episode_tasks(env, "test", 5, seed=3)
    played = run_eval_episodes(policy, pool, "test", episodes=5, seed=3, max_steps=2)
    assert [e.seed for e in played] == [3, 4, 5, 6, 7]  # episode i resets with seed + i, as scripted eval
    assert all(t.logprobs is None for e in played for t in e.turns)  # greedy
    first = evaluate_policy(policy, pool, "test", episodes=5, seed=3, max_steps=2)
    again = evaluate_policy(policy, env_factory("shop", **SHOP), "test", episodes=5, seed=3, max_steps=2)
    assert first == again
    assert set(first.to_dict()) == {"episodes", "success_rate", "mean_reward", "mean_steps", "invalid_action_rate"}
    assert first.episodes == 5 and 1 <= first.mean_steps <= 2


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("DREAMGYM_TEST_RAY") != "1",
    reason="starting Ray and its actor processes takes 15-90 s on a shared 2-core machine; set DREAMGYM_TEST_RAY=1",
)
def test_ray_pool_gives_the_same_episodes_as_the_local_pool(policy: LLMPolicy) -> None:
    ray = pytest.importorskip("ray", reason="ray is optional: pip install 'dreamgym[ray]'")
    from dreamgym.envs.pool import RayEnvPool

    factory = env_factory("shop", **SHOP)
    tasks = make("shop", **SHOP).tasks("train")[:2]
    local = collect_rollouts(LocalEnvPool(factory, 2), policy, tasks, group_size=2, max_steps=2, seed=2)
    pool = RayEnvPool(factory, num_envs=2, num_cpus=1)
    try:
        assert isinstance(pool, EnvPool) and pool.name == "shop" and pool.source == "real"
        remote = collect_rollouts(pool, policy, tasks, group_size=2, max_steps=2, seed=2)
    finally:
        pool.close()
        ray.shutdown()
    assert [[(t.action, t.next_state, t.reward) for t in e.turns] for e in remote] == [
        [(t.action, t.next_state, t.reward) for t in e.turns] for e in local
    ]
