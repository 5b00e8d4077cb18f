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
from dreamgym.rl.batch import collate, response_window, turn_rows
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
    assert [e.seed for e in episodes] == [7, 7, 7, 8, 8, 8]  # one reset seed per group
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


def test_a_grpo_group_shares_one_reset_seed_and_starts_from_one_state(policy: LLMPolicy, pool: LocalEnvPool) -> None:
    tasks = pool.tasks("train")[:2]
    episodes = collect_rollouts(pool, policy, tasks, group_size=3, max_steps=1, seed=7)
    assert [e.seed for e in episodes] == [7, 7, 7, 8, 8, 8]
    for group in (episodes[:3], episodes[3:]):
        assert len({(e.turns[0].state, tuple(e.turns[0].admissible)) for e in group}) == 1
    # the trajectories record the group's seed too
    assert [e.to_trajectory().meta["seed"] for e in episodes] == [7, 7, 7, 8, 8, 8]


def test_a_truncated_episode_keeps_its_final_state_and_the_critic_values_it(policy: LLMPolicy, pool: LocalEnvPool) -> None:
    from dreamgym.agent.policy import build_agent_prompt
    from dreamgym.rl.critic import Critic, truncated_values

    episodes = collect_rollouts(pool, policy, pool.tasks("train")[:2], group_size=2, max_steps=2, seed=3)
    assert any(e.final_obs is not None for e in episodes)  # an untrained policy mostly runs into the step limit
    for e in episodes:
        if e.turns[-1].terminated:
            assert e.final_obs is None
        else:
            assert e.final_obs is not None and e.turns[-1].truncated
            assert e.final_obs.state == e.turns[-1].next_state and len(e.final_obs.history) == len(e.turns)
            assert e.final_obs.history[-1] == (e.turns[-1].state, e.turns[-1].action)
    llm: Any = policy.llm
    critic = Critic.from_policy(llm.model)
    with torch.no_grad():
        critic.value_head.weight.normal_()
    values = truncated_values(critic, policy, episodes, llm.pad_id, micro_batch_size=1)
    assert [v is None for v in values] == [e.final_obs is None for e in episodes]
    i = next(i for i, e in enumerate(episodes) if e.final_obs is not None)
    obs = episodes[i].final_obs
    assert obs is not None
    ids = torch.tensor([llm.encode(build_agent_prompt(obs, policy.cfg))])
    with torch.no_grad():
        expected = critic(ids, torch.ones_like(ids)).item()
    assert values[i] == pytest.approx(expected, abs=1e-5)


def test_with_dropout_the_first_ratio_of_an_update_is_exactly_one(micro_dir: Path, pool: LocalEnvPool) -> None:
    """Old and new log-probs (and values) are computed with dropout off, whatever mode the model is in."""
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dreamgym.rl.config import RLConfig
    from dreamgym.rl.learner import Learner

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(micro_dir, attention_dropout=0.1)
    llm = HFLLM(model.eval(), AutoTokenizer.from_pretrained(micro_dir))
    policy = LLMPolicy(llm, PolicyConfig(max_new_tokens=8))
    rows = turn_rows(collect_rollouts(pool, policy, pool.tasks("train")[:2], group_size=2, max_steps=2, seed=0))
    batch = collate(rows, llm.pad_id, left=True)  # as the learner batches them: left-padded, its LM head windowed
    keep = response_window(rows)
    with torch.no_grad():  # exact behaviour log-probs: the dropout-free forward (generation's cache aside)
        exact = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], keep=keep)
    for i, row in enumerate(rows):
        row.old_logprobs = exact[i][batch["mask"][i, -keep:] > 0].tolist()
        row.advantage = 1.0 if i % 2 else -1.0
    learner = Learner(policy, RLConfig(algo="ppo", minibatch_size=1000, micro_batch_size=4, lr=1e-3))
    critic = learner.critic
    assert critic is not None
    with torch.no_grad():
        critic.value_head.bias.fill_(0.5)
        critic.value_head.weight.normal_()
    values = learner.values(rows)
    assert learner.values(rows) == values  # no dropout noise in V(s_t)
    for row, v in zip(rows, values, strict=True):
        row.old_value, row.ret = v, v + 1.0
    model.train()  # the mode a caller left it in is restored afterwards
    learner.cfg = learner.cfg.model_copy(update={"micro_batch_size": 1000})
    stats = learner.update(rows, np.random.default_rng(0))
    tokens = sum(len(r.response_ids) for r in rows)
    assert stats["logp_behaviour_gap"] * tokens < 1e-6  # max |log ρ| < 1e-6 on the first (only) micro-batch
    assert abs(stats["ratio_max"] - 1.0) < 1e-6 and abs(stats["ratio_mean"] - 1.0) < 1e-6
    assert stats["clip_frac"] == 0.0
    assert model.training and not critic.training


def test_a_prompt_too_long_for_the_context_is_cut_and_counted_not_raised(policy: LLMPolicy) -> None:
    """A dreamt page can be longer than any real one: the policy cuts the state (then the action list) until the
    prompt fits, counts it, and acts; the model itself still refuses an overlong prompt."""
    from dreamgym.agent.policy import AgentObservation, build_agent_prompt

    llm = policy.llm
    assert isinstance(llm, HFLLM) and llm.max_length is not None
    page = "\n".join(f"[{i}] link: B0{i:06d} — Wool Socks Number {i} | ${i}.99" for i in range(1, 400))
    actions = [f"click[b0{i:06d}]" for i in range(1, 400)]
    obs = AgentObservation("buy wool socks", page, actions, [])
    with pytest.raises(ValueError, match="exceeds the model's context"):  # as built, it does not fit
        llm.generate([build_agent_prompt(obs, policy.cfg)], policy.sampling(True, 0))
    short = AgentObservation("buy wool socks", "[1] link: B0000001 — Wool Socks | $1.99", actions[:1], [])
    steps = policy.act([obs, short], greedy=True, seed=0)
    assert len(steps) == 2 and policy.shortened == 1  # only the long one was cut
    assert len(steps[0].prompt_ids) + policy.cfg.max_new_tokens <= llm.max_length
    assert "[1] link: B0000001" in llm.tokenizer.decode(steps[0].prompt_ids)  # the page's top stays, and the task
    assert "TASK: buy wool socks" in llm.tokenizer.decode(steps[0].prompt_ids)


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


@pytest.mark.parametrize("action_format", ["text", "index"])
def test_admissible_decoding_makes_every_greedy_action_admissible(micro_dir: Path, action_format: str) -> None:
    """An untrained policy writes invalid actions; guided to the admissible answers its greedy ones never are,
    while its sampled (RL) actions stay free."""
    llm = HFLLM.from_pretrained(micro_dir)
    free, guided = (LLMPolicy(llm, PolicyConfig(max_new_tokens=40, action_format=action_format,  # type: ignore[arg-type]
                                                decoding=d)) for d in ("free", "admissible"))
    pool = LocalEnvPool(env_factory("shop", **SHOP), num_envs=4)
    played = {p.cfg.decoding: [t for e in run_eval_episodes(p, pool, "test", episodes=6, seed=0, max_steps=3)
                               for t in e.turns] for p in (free, guided)}
    assert sum(t.invalid for t in played["free"]) > len(played["free"]) / 2
    assert played["admissible"] and not any(t.invalid for t in played["admissible"])
    assert all(t.action for t in played["admissible"])
    sampled = collect_rollouts(pool, guided, pool.tasks("train")[:2], group_size=2, max_steps=2, seed=0)
    assert any(t.invalid for e in sampled for t in e.turns)  # sampling is not guided


def test_action_masking_samples_admissible_actions_and_the_learner_scores_them_under_the_same_mask(
    micro_dir: Path, pool: LocalEnvPool
) -> None:
    """With ``sampling="admissible"`` an untrained policy's sampled actions are all admissible, each token keeps
    the set it was drawn among, and the learner's first ratio is 1 only because it applies the same mask."""
    import numpy as np

    from dreamgym.rl.config import RLConfig
    from dreamgym.rl.learner import Learner

    llm = HFLLM.from_pretrained(micro_dir)
    policy = LLMPolicy(llm, PolicyConfig(max_new_tokens=40, action_format="index", sampling="admissible"))
    episodes = collect_rollouts(pool, policy, pool.tasks("train")[:3], group_size=2, max_steps=3, seed=0)
    turns = [t for e in episodes for t in e.turns]
    assert turns and not any(t.invalid for t in turns) and all(t.parsed for t in turns)
    assert len({t.action for t in turns}) > 1  # sampled, not one argmax
    for t in turns:
        assert t.allowed_ids is not None and len(t.allowed_ids) == len(t.response_ids)
        assert all(tok in allowed for tok, allowed in zip(t.response_ids, t.allowed_ids, strict=True))
    rows = turn_rows(episodes)
    for i, row in enumerate(rows):
        row.advantage = 1.0 if i % 2 else -1.0
    batch = collate(rows, llm.pad_id)
    with torch.no_grad():  # the unmasked softmax is not what the tokens were sampled from
        free = sequence_logprobs(llm.model, batch["input_ids"], batch["attention_mask"])
    assert float(((free - batch["old_logp"]).abs() * batch["mask"]).max()) > 0.05
    learner = Learner(policy, RLConfig(minibatch_size=1000, micro_batch_size=1000, lr=1e-3))
    stats = learner.update(rows, np.random.default_rng(0))
    assert stats["logp_behaviour_gap"] < 1e-5 and abs(stats["ratio_max"] - 1.0) < 1e-4


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


@pytest.mark.parametrize("masked", [False, True])
def test_the_windowed_loss_equals_the_whole_sequences(micro_dir: Path, pool: LocalEnvPool, masked: bool) -> None:
    """The learner scores left-padded micro-batches with the LM head on the response window only
    (``logits_to_keep``): its log-probs, loss, entropy and gradients equal those of the right-padded batch's
    whole-sequence logits, with action masking too."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dreamgym.rl.config import RLConfig
    from dreamgym.rl.learner import Learner

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(micro_dir)
    llm = HFLLM(model.eval(), AutoTokenizer.from_pretrained(micro_dir))
    policy = LLMPolicy(llm, PolicyConfig(max_new_tokens=8))
    rows = turn_rows(collect_rollouts(pool, policy, pool.tasks("train")[:3], group_size=2, max_steps=3, seed=0))
    for i, row in enumerate(rows):  # responses of several lengths (the untrained model's run to max_new_tokens)
        n = 3 + i % 6
        row.response_ids = row.response_ids[:n]
        row.old_logprobs = [x - 0.05 * (i % 2) for x in row.old_logprobs[:n]]  # ratios away from 1: clipping applies
        row.advantage = (-1.0) ** i * (1 + i % 3)
        if masked:  # each response token among itself and two others
            row.allowed_ids = [sorted({t, (t + 1) % 50, (t + 7) % 50}) for t in row.response_ids]
    assert len({len(r.prompt_ids) for r in rows}) > 1 and len({len(r.response_ids) for r in rows}) > 1
    learner = Learner(policy, RLConfig(minibatch_size=1000, micro_batch_size=1000, entropy_coef=0.01, kl_coef=0.05))
    assert learner.window  # a Hugging Face causal LM takes logits_to_keep
    from dreamgym.rl.learner import _KeepLogits

    results = []
    for window in (True, False):
        learner.window = window
        model.zero_grad(set_to_none=True)
        loss, stats = learner._policy_loss(_KeepLogits(model), learner._collate(rows, left=window), rows)
        loss.backward()
        results.append((loss.item(), stats, {n: p.grad.clone() for n, p in model.named_parameters()
                                             if p.grad is not None}))
    (loss_w, stats_w, grads_w), (loss_f, stats_f, grads_f) = results
    assert loss_w == pytest.approx(loss_f, rel=1e-5, abs=1e-7)
    for key in ("entropy", "kl", "ratio_mean", "clip_frac", "logp_behaviour_gap"):
        assert stats_w[key] == pytest.approx(stats_f[key], rel=1e-4, abs=1e-7), key
    assert grads_w.keys() == grads_f.keys() and grads_w
    for name, g in grads_w.items():
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, grads_f[name], rtol=1e-4, atol=1e-6, msg=name)


class StillShop(ShopEnv):
    """The real shop, saying that every page of even length changed nothing (an arbitrary, checkable rule)."""

    def had_effect(self, state: str, next_state: str) -> bool:
        return len(next_state) % 2 == 1


def test_the_no_effect_penalty_lowers_exactly_the_flagged_valid_turns(micro_dir: Path) -> None:
    """``TextEnv.step`` flags a valid, non-final step its env says changed nothing (``info["no_effect"]``); the
    rollout subtracts ``no_effect_penalty`` from that turn's reward, beside the invalid-action penalty, and GRPO's
    ``step`` mode charges it to the turn's own advantage as it does the invalid-action penalty."""
    from dreamgym.rl.batch import grpo_advantages

    pool = LocalEnvPool(lambda: StillShop(**SHOP), num_envs=4)
    policy = LLMPolicy(HFLLM.from_pretrained(micro_dir),
                       PolicyConfig(max_new_tokens=40, action_format="index", sampling="admissible"))
    episodes = collect_rollouts(pool, policy, pool.tasks("train")[:3], group_size=2, max_steps=4, seed=0,
                                invalid_action_penalty=0.25, no_effect_penalty=0.05)
    turns = [t for e in episodes for t in e.turns]
    for t in turns:
        flagged = not t.terminated and not t.invalid and len(t.next_state) % 2 == 0
        assert t.no_effect == flagged
        assert t.reward == pytest.approx(t.env_reward - 0.25 * t.invalid - 0.05 * t.no_effect)
    assert 0 < sum(t.no_effect for t in turns) < len(turns)
    rows = turn_rows(episodes)
    grpo_advantages(episodes, rows, normalize_std=False, invalid_penalty_mode="step")
    k = 0
    for e in episodes:  # less each turn's own penalties, every turn of an episode has the episode's advantage
        advantages = [rows[k + i].advantage + 0.25 * t.invalid + 0.05 * t.no_effect for i, t in enumerate(e.turns)]
        assert max(advantages) - min(advantages) < 1e-9, advantages
        k += len(e.turns)
    assert k == len(rows)
