"""Curriculum: feasible shop variations, variance-driven seed selection, λ-bounded sampling, the LLM operator."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from dreamgym.curriculum import LLMVariationOperator, TaskGenerator, TaskSet, cluster_groups, parse_variations
from dreamgym.envs import make
from dreamgym.envs.shop.reward import ShopGoal, satisfies
from dreamgym.envs.shop.variations import ShopVariationOperator
from dreamgym.llm.base import Completion, Prompt, SamplingParams
from dreamgym.replay import HashingEncoder
from dreamgym.rl.advantages import reward_variance


@pytest.fixture(scope="module")
def shop():
    return make("shop", num_products=200)


def test_shop_variations_are_feasible_distinct_and_harder(shop) -> None:
    op = ShopVariationOperator(num_products=200)
    rng = random.Random(0)
    seeds = shop.tasks("train")[:40]
    made = 0
    for seed in seeds:
        base = ShopGoal.from_dict(seed.goal)
        for v in op(seed, 3, rng):
            made += 1
            goal = ShopGoal.from_dict(v.goal)
            assert v.origin == "synthetic" and v.parent_id == seed.task_id and v.task_id != seed.task_id
            assert satisfies(goal, op.catalog.get(base.asin))  # still feasible: the target satisfies it
            assert goal != base and goal.category == base.category
            assert len(goal.attributes) >= len(base.attributes) and goal.price_upper <= base.price_upper
            # The real shop can play and score it, and its oracle solves it.
            oracle = shop.scripted_policy("oracle")
            obs, info = shop.reset(seed=0, options={"task": v})
            oracle.reset(shop, v)
            for _ in range(15):
                obs, r, term, trunc, info = shop.step(oracle.act(obs, info))
                if term or trunc:
                    break
            assert info["success"], v.instruction
    assert made >= 60


def test_seed_selection_by_variance_and_lambda_bounded_sampling() -> None:
    seeds = [t for t in make("shop", num_products=200).tasks("train")[:20]]
    ts = TaskSet(seeds)
    rewards = [1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0]  # tasks 0..3, groups of 4
    groups = [seeds[i // 4].task_id for i in range(16)]
    v = reward_variance(torch.tensor(rewards, dtype=torch.float32), groups)
    assert v[seeds[0].task_id] == pytest.approx(0.25) and v[seeds[1].task_id] == 0.0
    gen = TaskGenerator(ShopVariationOperator(num_products=200), seeds_per_iter=2, variations_per_seed=3)
    chosen = gen.select_seeds(v, ts)
    assert [t.task_id for t in chosen] == sorted([seeds[0].task_id, seeds[3].task_id], key=lambda i: (-v[i], i))
    added = gen.step(v, ts, iteration=0, rng=random.Random(0))
    assert added and all(t.parent_id in {seeds[0].task_id, seeds[3].task_id} for t in added)
    assert ts.entries[seeds[0].task_id].variances == [pytest.approx(0.25)]
    rng = random.Random(1)
    for lam in (0.0, 0.25, 0.5):
        batch = ts.sample(8, rng, synthetic_share=lam)
        assert len(batch) == len({t.task_id for t in batch}) == 8
        assert sum(t.origin == "synthetic" for t in batch) <= int(lam * 8)
    # Duplicate tasks are not added twice.
    assert ts.add(added, iteration=1) == []


def test_taskset_round_trip(tmp_path: Path) -> None:
    ts = TaskSet(make("shop", num_products=200).tasks("train")[:5])
    ts.record_variances({ts.seed_ids[0]: 0.25})
    ts.save(tmp_path / "tasks.jsonl")
    back = TaskSet.load(tmp_path / "tasks.jsonl")
    assert back.entries == ts.entries
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        TaskSet.load(tmp_path / "bad.jsonl")


class CannedLLM:
    """Returns fixed teacher outputs: a legitimate stand-in for what an LLM writes, to test parsing/filtering."""

    tokenizer = None

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        return [Completion(text=self.texts[i % len(self.texts)], token_ids=[]) for i in range(len(prompts))]

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
        raise NotImplementedError


def test_llm_operator_parses_selection_and_discards_malformed() -> None:
    seed = make("shop", num_products=200).tasks("train")[0]
    good = ("TASK [1]: i need a red cotton shirt in size m under 20 dollars\n"
            "TASK [2]: i want a blue linen shirt, price lower than 25 dollars\nSELECTION: [2]\nREASONING: harder")
    no_selection = "TASK [1]: i need a green shirt please now\n"
    bad_choice = "TASK [1]: ok\nSELECTION: [1]"
    op = LLMVariationOperator(CannedLLM([good, no_selection, bad_choice, "garbage <state>"]))
    out = op(seed, 4, random.Random(0))
    assert [t.instruction for t in out] == ["i want a blue linen shirt, price lower than 25 dollars"]
    assert out[0].origin == "synthetic" and out[0].parent_id == seed.task_id
    assert op.discarded == 3
    cands, sel = parse_variations(good, 4)
    assert len(cands) == 2 and sel == 2


def test_ppo_clusters_group_similar_tasks() -> None:
    tasks = make("shop", num_products=200).tasks("train")[:60]
    groups = cluster_groups(tasks, HashingEncoder(), n_clusters=5)
    assert set(groups) == {t.task_id for t in tasks} and len(set(groups.values())) > 1
    # Tasks of the same category mostly share a cluster.
    by_cat: dict[str, list[int]] = {}
    for t in tasks:
        by_cat.setdefault(t.goal["category"], []).append(groups[t.task_id])
    purity = sum(max(c.count(x) for x in set(c)) for c in by_cat.values()) / len(tasks)
    assert purity > 0.6
