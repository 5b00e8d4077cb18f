"""The RL trainer on the real shop with a micro policy: GRPO and PPO iterations update the weights, the KL to
the reference is 0 before the first update, real transitions are counted exactly, a resumed run continues
bit for bit, the budget stops training, and the CLI trains and evaluates a run directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import clone_oracle_policy
from safetensors.torch import load_file
from typer.testing import CliRunner

from dreamgym.agent.policy import PolicyConfig, save_policy
from dreamgym.baselines.sft import bc_examples, init_model
from dreamgym.collect import iter_episodes
from dreamgym.envs import make, register
from dreamgym.envs.shop import ShopEnv
from dreamgym.rl.trainer import RLConfig, tasks_within_budget, train
from dreamgym.types import read_jsonl

torch.set_num_threads(1)

SHOP: dict[str, Any] = {"num_products": 100, "num_tasks_per_split": 1}  # one train task: the one cloned below


class CountingShop(ShopEnv):
    """The real shop, counting every ``step`` call across instances."""

    steps_taken = 0

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        CountingShop.steps_taken += 1
        return super().step(action)


register("counting-shop", CountingShop)


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A micro policy that has memorised the oracle on the train task greedily, but not when sampling
    (:func:`conftest.clone_oracle_policy`)."""
    return clone_oracle_policy(tmp_path_factory.mktemp("bc") / "run", **SHOP)


def config(sft_run: Path, **overrides: Any) -> RLConfig:
    base: dict[str, Any] = {
        "init": str(sft_run), "env": "counting-shop", "env_kwargs": SHOP, "iterations": 1, "tasks_per_iter": 2,
        "group_size": 4, "max_steps": 4, "temperature": 1.0, "lr": 1e-3, "minibatch_size": 1000,
        "micro_batch_size": 8, "eval_episodes": 2, "eval_every": 0, "save_every": 1, "num_threads": 1,
    }
    return RLConfig.model_validate({**base, **overrides})


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    model_dir = run_dir / "model"
    return load_file(str(model_dir / "model.safetensors"))


def changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_grpo_iteration_updates_the_policy_and_counts_real_transitions(sft_run: Path, tmp_path: Path) -> None:
    before = CountingShop.steps_taken
    # The episodes of a group share their reset seed, so only the sampler tells them apart, and this policy writes
    # a valid action only now and then: seed 1 is a run whose first iteration has a group with a signal.
    summary = train(config(sft_run, algo="grpo", kl_coef=0.02, seed=1), tmp_path / "run")
    env_steps = CountingShop.steps_taken - before
    rollouts = list(read_jsonl(tmp_path / "run" / "rollouts" / "iter_00001.jsonl"))
    assert len(rollouts) == 8 and summary["real_transitions"] == sum(t.num_steps for t in rollouts)
    assert summary["real_transitions"] + summary["eval_transitions"] == env_steps
    assert summary["iterations"] == 1 and summary["eval_episodes"] == 2
    assert {"success_rate", "mean_reward", "initial_eval"} <= set(summary)
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    start, final = (json.loads((tmp_path / "run" / f).read_text()) for f in ("eval_tasks_start.json", "eval_tasks.json"))
    assert (start["iteration"], final["iteration"]) == (0, 1)  # the start's per-task outcomes are kept, to pair with
    assert [t["task_id"] for t in start["per_task"]] == [t["task_id"] for t in final["per_task"]]
    shaped = [t.total_reward - 0.1 * sum(bool(x.info["invalid_action"]) for x in t.transitions) for t in rollouts]
    assert len(set(shaped[:4])) > 1 or len(set(shaped[4:])) > 1  # some group has a non-zero advantage
    m = metrics(tmp_path / "run")[0]
    assert m["kl"] == 0.0  # one minibatch, scored before the optimizer step: π_θ = π_ref
    assert m["logp_behaviour_gap"] < 1e-4  # recomputed log-probs = generation-time log-probs
    assert changed(weights(sft_run), weights(tmp_path / "run"))
    assert (tmp_path / "run" / "tb").is_dir() and (tmp_path / "run" / "checkpoint" / "optimizer.pt").is_file()


def test_grpo_with_action_masking_samples_only_admissible_actions(sft_run: Path, tmp_path: Path) -> None:
    """``action_masking``: no training rollout takes an invalid action, the loss scores the sampled tokens under the
    mask they were drawn with (first ratio 1), the run's policy samples guided, and a server cannot do it."""
    summary = train(config(sft_run, action_masking=True, seed=1), tmp_path / "run")
    rollouts = list(read_jsonl(tmp_path / "run" / "rollouts" / "iter_00001.jsonl"))
    assert len(rollouts) == 8 and summary["real_transitions"] == sum(t.num_steps for t in rollouts)
    assert not any(x.info["invalid_action"] for t in rollouts for x in t.transitions)
    m = metrics(tmp_path / "run")[0]
    assert m["logp_behaviour_gap"] < 1e-4
    saved = PolicyConfig.model_validate_json((tmp_path / "run" / "policy.json").read_text())
    assert (saved.sampling, saved.decoding) == ("admissible", "admissible")  # it acts under the mask it learnt under
    with pytest.raises(ValueError, match="action_masking needs in-process rollouts"):
        RLConfig.model_validate({"action_masking": True, "rollout_server": {"base_url": "http://x", "model": "m"}})


def test_gigpo_run_logs_its_step_groups(sft_run: Path, tmp_path: Path) -> None:
    """Every episode of a group resets to the same first page, so the first turns always form a step group."""
    train(config(sft_run, algo="grpo", step_advantage_weight=1.0, seed=1), tmp_path / "run")
    (line,) = metrics(tmp_path / "run")
    assert line["step_groups"] >= 2  # at least the two tasks' first pages
    assert 0 < line["step_grouped_share"] <= 1


def test_ppo_iteration_updates_policy_and_critic(sft_run: Path, tmp_path: Path) -> None:
    summary = train(config(sft_run, algo="ppo", minibatch_size=8), tmp_path / "run")
    assert summary["algo"] == "ppo" and summary["iterations"] == 1
    assert changed(weights(sft_run), weights(tmp_path / "run"))
    critic = load_file(str(tmp_path / "run" / "checkpoint" / "critic.safetensors"))
    assert float(critic["value_head.weight"].abs().sum()) > 0  # zero-initialised, then trained
    assert metrics(tmp_path / "run")[0]["value_loss"] >= 0


def test_resumed_run_continues_bit_for_bit(sft_run: Path, tmp_path: Path) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(config(sft_run, iterations=2, minibatch_size=8), straight)
    train(config(sft_run, iterations=1, minibatch_size=8), split)
    train(config(sft_run, iterations=2, minibatch_size=8), split, resume=True)
    second = [list(read_jsonl(run / "rollouts" / "iter_00002.jsonl")) for run in (straight, split)]
    assert [[x.action for x in t.transitions] for t in second[0]] == [[x.action for x in t.transitions] for t in second[1]]
    a, b = weights(straight), weights(split)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [m["iteration"] for m in metrics(split)] == [1, 2]
    assert json.loads((split / "summary.json").read_text())["real_transitions"] == json.loads(
        (straight / "summary.json").read_text())["real_transitions"]
    with pytest.raises(ValueError, match="already holds a run"):
        train(config(sft_run), split)


def test_real_transition_budget_stops_training(sft_run: Path, tmp_path: Path) -> None:
    summary = train(config(sft_run, iterations=5, real_transition_budget=1), tmp_path / "run")
    # One group of 4 episodes of at most 4 steps (not the whole 2-task iteration) was all the budget allowed.
    assert summary["iterations"] == 1 and 1 <= summary["real_transitions"] <= 4 * 4
    assert summary["evals"][-1]["iteration"] == 1  # the last evaluation is of the final policy


def test_the_last_iterations_shrink_to_the_real_transition_budget(sft_run: Path) -> None:
    cfg = config(sft_run, tasks_per_iter=8, group_size=4, max_steps=5, real_transition_budget=100)
    # A group costs at most 4 * 5 = 20 transitions: 5 groups fit in 100, then fewer as the budget is used.
    assert [tasks_within_budget(cfg, used) for used in (0, 30, 81, 99)] == [5, 3, 1, 1]
    assert tasks_within_budget(config(sft_run, tasks_per_iter=8), 10_000) == 8  # no budget: the full iteration
    strict = cfg.model_copy(update={"strict_budget": True})  # never over: no group when none surely fits
    assert [tasks_within_budget(strict, used) for used in (0, 30, 81, 99)] == [5, 3, 0, 0]


def test_strict_budget_never_exceeds_the_real_transition_budget(sft_run: Path, tmp_path: Path) -> None:
    cfg = config(sft_run, iterations=5, tasks_per_iter=2, group_size=2, max_steps=4, real_transition_budget=12,
                 strict_budget=True)
    summary = train(cfg, tmp_path / "run")
    # a group takes at most 2 episodes x 4 steps = 8: one fits in 12, then another only if the first left >= 8
    assert summary["iterations"] >= 1 and 2 <= summary["real_transitions"] <= 12


def test_config_rejects_unknown_fields_and_grpo_without_groups(sft_run: Path, tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("algo: ppo\nlr: 0.001\n")
    cfg = RLConfig.from_yaml(tmp_path / "c.yaml", {"group_size": 1})
    assert cfg.algo == "ppo" and cfg.lr == 1e-3 and cfg.group_size == 1
    with pytest.raises(ValueError, match="learning_rate"):
        RLConfig.model_validate({"learning_rate": 1.0})
    with pytest.raises(ValueError, match="group_size >= 2"):
        RLConfig(algo="grpo", group_size=1)


def test_cli_trains_then_evaluates_the_run(
    sft_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dreamgym.cli import app, main

    out = tmp_path / "run"
    sets = ["iterations=3", "tasks_per_iter=1", "group_size=2", "max_steps=2", "eval_episodes=2", "num_threads=1",
            "env_kwargs={num_products: 100, num_tasks_per_split: 1}"]
    args = ["train", "--env", "shop", "--algo", "grpo", "--init", str(sft_run), "--out", str(out)]
    r = CliRunner().invoke(app, [*args, "--real-budget", "1", *(x for s in sets for x in ("--set", s))])
    assert r.exit_code == 0, r.output
    line = json.loads(r.stdout.strip().splitlines()[-1])
    # The budget (1 real transition) stops the run after its first iteration of one group.
    assert line["iterations"] == 1 and 2 <= line["real_transitions"] <= 4 and line["eval_episodes"] == 2
    r = CliRunner().invoke(app, ["eval", "--env", "shop", "--env-arg", "num_products=100", "--policy", str(out),
                                 "--split", "test", "--episodes", "3", "--json"])
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 3 and {"success_rate", "mean_reward", "mean_steps", "invalid_action_rate"} <= set(result)
    monkeypatch.setattr(sys, "argv", ["dreamgym", *args])  # the run exists and --resume is missing
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2 and "already holds a run" in capsys.readouterr().err


def test_grpo_episode_turn_weighting_gives_every_episode_equal_weight() -> None:
    from dreamgym.rl.batch import TurnRow, grpo_advantages
    from dreamgym.rl.rollout import Episode, Turn
    from dreamgym.types import Task

    def episode(reward: float, turns: int) -> Episode:
        e = Episode(task=Task(task_id="t", instruction="x"), group_id=0, seed=0, source="real")
        for i in range(turns):
            r = reward if i == turns - 1 else 0.0
            e.turns.append(Turn("s", [], [1], [2], [0.0], "", "a", True, "s2", r, r, i == turns - 1, False, {}))
        return e

    eps = [episode(1.0, 1), episode(0.0, 3)]  # a 1-turn success and a 3-turn failure; mean turns = 2
    rows = [TurnRow([1], [2], [0.0]) for _ in range(4)]
    grpo_advantages(eps, rows, normalize_std=False, turn_weighting="token")
    assert [r.advantage for r in rows] == [0.5, -0.5, -0.5, -0.5]  # Dr.GRPO: r - mean = ±0.5 on every turn
    grpo_advantages(eps, rows, normalize_std=False, turn_weighting="episode")
    # scaled by mean_turns / turns: 2/1 for the success, 2/3 for the failure -> summed weight +1.0 vs -1.0
    assert [r.advantage for r in rows] == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_config_refuses_truncated_sampling_and_a_k1_kl_loss() -> None:
    assert (RLConfig().top_p, RLConfig().top_k, RLConfig().bootstrap_truncated, RLConfig().clip_ratio_c) == (
        1.0, None, False, None)
    RLConfig(top_k=0)  # 0 = off
    with pytest.raises(ValueError, match=r"on-policy RL samples with top_p=1\.0"):
        RLConfig(top_p=0.9)
    with pytest.raises(ValueError, match=r"on-policy RL samples with top_p=1\.0"):
        RLConfig(top_k=40)
    with pytest.raises(ValueError, match=r"'k1' cannot be the KL loss.*'k3'.*'k2'"):
        RLConfig(kl_estimator="k1", kl_coef=0.02)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        RLConfig(clip_ratio_c=0.5)


def test_a_saved_top_p_below_one_is_overridden_for_rl(
    sft_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    nucleus = tmp_path / "nucleus"
    shutil.copytree(sft_run, nucleus)
    policy_cfg = PolicyConfig.model_validate_json((nucleus / "policy.json").read_text())
    (nucleus / "policy.json").write_text(policy_cfg.model_copy(update={"top_p": 0.5}).model_dump_json())
    with caplog.at_level("WARNING", logger="dreamgym.agent.policy"):
        train(config(sft_run, init=str(nucleus), eval_at_start=False, eval_episodes=1), tmp_path / "run")
    assert PolicyConfig.model_validate_json((tmp_path / "run" / "policy.json").read_text()).top_p == 1.0
    assert any("top_p=0.5 is replaced by top_p=1" in r.getMessage() for r in caplog.records)


def test_ppo_bootstraps_truncated_episodes_with_the_critic_when_asked() -> None:
    from dreamgym.rl.batch import TurnRow, ppo_advantages
    from dreamgym.rl.rollout import Episode, Turn
    from dreamgym.types import Task

    e = Episode(task=Task(task_id="t", instruction="x"), group_id=0, seed=0, source="real")
    for r in (0.0, 1.0):  # two turns, cut by the step limit after the second
        e.turns.append(Turn("s", [], [1], [2], [0.0], "", "a", True, "s2", r, r, False, r == 1.0, {}))
    rows = [TurnRow([1], [2], [0.0], old_value=v) for v in (0.5, 0.8)]
    cfg = RLConfig(algo="ppo", gamma=0.9, lam=0.8, normalize_advantages=False, group_size=1)
    ppo_advantages([e], rows, cfg)  # default: the cut is terminal, V_T = 0
    assert [r.advantage for r in rows] == pytest.approx([0.364, 0.2]) and rows[1].ret == pytest.approx(1.0)
    ppo_advantages([e], rows, cfg, [2.0])  # V(s_T) = 2: A1 = 1 + 0.9·2 − 0.8 = 2, A0 = 0.22 + 0.72·2 = 1.66
    assert [r.advantage for r in rows] == pytest.approx([1.66, 2.0]) and rows[1].ret == pytest.approx(2.8)
    ppo_advantages([e], rows, cfg, [None])  # a terminal episode in a bootstrapped batch
    assert [r.advantage for r in rows] == pytest.approx([0.364, 0.2])


def test_ppo_run_with_bootstrap_and_dual_clip_then_a_resume_with_another_horizon_warns(
    sft_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    cfg = config(sft_run, algo="ppo", minibatch_size=8, bootstrap_truncated=True, clip_ratio_c=3.0,
                 eval_at_start=False, eval_episodes=1)
    train(cfg, run)
    assert "clip_frac_lower" in metrics(run)[0]
    with caplog.at_level("WARNING", logger="dreamgym.rl.critic"):
        train(cfg.model_copy(update={"iterations": 2, "max_steps": 3}), run, resume=True)
    assert any("max_steps=4 but this run uses max_steps=3" in r.getMessage() for r in caplog.records)
    assert [m["iteration"] for m in metrics(run)] == [1, 2]


def test_a_run_whose_every_action_is_invalid_warns(sft_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An untrained policy writes no valid action: the update then learns nothing, and the trainer says so."""
    env = make("shop", **SHOP)
    trajs = list(iter_episodes(env, env.scripted_policy("oracle"), 1, seed=0))
    policy_cfg = PolicyConfig(max_new_tokens=4)
    model, tokenizer = init_model("micro", trajs, bc_examples(trajs, policy_cfg), vocab_size=1024, seed=0)
    save_policy(tmp_path / "untrained", model, tokenizer, policy_cfg)
    with caplog.at_level("WARNING", logger="dreamgym.rl.trainer"):
        train(config(sft_run, init=str(tmp_path / "untrained"), max_steps=2), tmp_path / "run")
    assert metrics(tmp_path / "run")[0]["invalid_rate"] == 1.0
    assert any("every action was invalid" in r.getMessage() for r in caplog.records)


class Crash(Exception):
    """Stands for a kill: nothing after it runs (the trainer commits nothing on its way out)."""


class CrashingShop(CountingShop):
    """Counts steps like CountingShop and dies at the ``crash_at``-th step counted (0: never)."""

    crash_at = 0

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if CrashingShop.crash_at and CountingShop.steps_taken + 1 >= CrashingShop.crash_at:
            CrashingShop.crash_at = 0
            raise Crash
        return super().step(action)


register("crashing-shop", CrashingShop)


def test_real_steps_of_a_killed_iteration_are_charged_on_resume(sft_run: Path, tmp_path: Path) -> None:
    """A kill mid-iteration loses the iteration, not the real interaction it used: the resumed run charges it,
    so real_transitions counts every env.step a training rollout made, across attempts."""
    run = tmp_path / "run"
    cfg = config(sft_run, env="crashing-shop", iterations=2, save_every=1, eval_at_start=False)
    start = CountingShop.steps_taken
    train(cfg.model_copy(update={"iterations": 1}), run)  # the checkpoint of iteration 1
    first = json.loads((run / "summary.json").read_text())
    CrashingShop.crash_at = CountingShop.steps_taken + 5  # dies 5 steps into iteration 2's rollouts
    with pytest.raises(Crash):
        train(cfg, run, resume=True)
    # charged before each batched step: the whole first batch of iteration 2 (2 tasks x 4 episodes), though
    # the kill came 4 steps into it -- never fewer steps than were taken
    assert json.loads((run / "uncharged_real_steps.json").read_text()) == {"after_iteration": 1, "steps": 8}
    summary = train(cfg, run, resume=True)
    all_steps = CountingShop.steps_taken - start  # every env.step of the three attempts (training and eval)
    assert summary["real_transitions"] + summary["eval_transitions"] == all_steps - 4 + 8
    rollouts = [t for i in (1, 2) for t in read_jsonl(run / "rollouts" / f"iter_{i:05d}.jsonl")]
    assert summary["real_transitions"] == sum(t.num_steps for t in rollouts) + 8  # + the killed attempt's batch
    assert first["real_transitions"] < summary["real_transitions"]
    assert json.loads((run / "uncharged_real_steps.json").read_text())["steps"] == 0  # committed


def test_curriculum_fields_written_inside_dream_move_to_the_curriculum_config() -> None:
    old = {"dream": {"experience_model": "m", "task_generator": "none", "synthetic_share": 0.5},
           "curriculum": {"seeds_per_iter": 1}}
    cfg = RLConfig.model_validate(old)
    assert cfg.dream is not None and cfg.dream.experience_model == "m"
    assert (cfg.curriculum.task_generator, cfg.curriculum.synthetic_share, cfg.curriculum.seeds_per_iter) == ("none", 0.5, 1)
    assert RLConfig.model_validate_json(cfg.model_dump_json()) == cfg
    assert cfg.curriculum.task_generator_for("shop", {}) is None  # "none": no task generation


def test_real_pools_keep_the_no_op_pool_hooks() -> None:
    from dreamgym.envs.pool import EnvPool, LocalEnvPool, env_factory

    pool = LocalEnvPool(env_factory("shop", **SHOP), num_envs=1)
    pool.on_iteration_start(3)
    assert isinstance(pool, EnvPool) and pool.task_generator_llm is None and pool.encoder is None
    assert pool.checkpoint_state() == {} and pool.load_checkpoint_state({"buffer_rows": 5}) == {} and pool.report() == {}
    pool.close()


def test_a_run_without_evaluation_episodes_trains_and_says_it_has_no_success_rate(sft_run: Path, tmp_path: Path) -> None:
    summary = train(config(sft_run, eval_episodes=0), tmp_path / "run")  # crashed in the final evaluation
    assert summary["iterations"] == 1 and summary["evals"] == [] and summary["success_rate"] is None
    assert summary["real_transitions"] > 0


def _two_turn_episode(reward: float, invalid_first: bool, success: bool = False) -> Any:
    """An episode of group 0: turn 0 earns nothing (invalid, penalty 0.1, if ``invalid_first``), turn 1 ends it
    with env reward ``reward``."""
    from dreamgym.rl.rollout import Episode, Turn
    from dreamgym.types import Task

    e = Episode(task=Task(task_id="t", instruction="x"), group_id=0, seed=0, source="real", success=success)
    for i in range(2):
        env_r = reward if i == 1 else 0.0
        bad = invalid_first and i == 0
        e.turns.append(Turn("s", [], [1], [2], [0.0], "", "a", True, "s2", env_r, env_r - (0.1 if bad else 0.0),
                            i == 1, False, {"invalid_action": bad}))
    return e


def test_grpo_invalid_penalty_on_the_episode_or_on_the_invalid_step() -> None:
    """One group of two 2-turn episodes, env returns 1 and 0; the success's first turn is invalid (penalty 0.1)."""
    from dreamgym.rl.batch import TurnRow, grpo_advantages

    episode = _two_turn_episode
    eps = [episode(1.0, invalid_first=True), episode(0.0, invalid_first=False)]
    rows = [TurnRow([1], [2], [0.0]) for _ in range(4)]
    # episode: shaped returns 0.9 and 0 -> Dr.GRPO ±0.45 on every turn of each episode
    grpo_advantages(eps, rows, normalize_std=False, invalid_penalty_mode="episode")
    assert [r.advantage for r in rows] == pytest.approx([0.45, 0.45, -0.45, -0.45])
    # step: env returns 1 and 0 -> ±0.5, and only the invalid turn pays its 0.1
    grpo_advantages(eps, rows, normalize_std=False, invalid_penalty_mode="step")
    assert [r.advantage for r in rows] == pytest.approx([0.4, 0.5, -0.5, -0.5])
    # with the std: the episode's advantage is normalised (±0.7071 for two episodes), the raw penalty is not
    grpo_advantages(eps, rows, normalize_std=True, invalid_penalty_mode="step")
    a = 0.5 / (0.5**0.5 + 1e-6)
    assert [r.advantage for r in rows] == pytest.approx([a - 0.1, a, -a, -a])
    grpo_advantages(eps, rows, normalize_std=True, invalid_penalty_mode="episode")
    assert [r.advantage for r in rows] == pytest.approx([a, a, -a, -a])  # 0.9 vs 0: the same ±0.7071
    assert RLConfig().invalid_penalty_mode == "episode"
    with pytest.raises(ValueError, match="invalid_penalty_mode"):
        RLConfig(invalid_penalty_mode="turn")


def test_gigpo_step_term_credits_the_turn_that_differed_where_the_episode_term_cannot() -> None:
    """Two episodes of one group visit s0 then s1; at s1 one buys right (1.0), one wrong (0.5). Dr.GRPO gives
    every turn ±0.25; the step term (ω = 1, γ = 0.5) adds ±0.125 at s0 (returns 0.5 and 0.25) and ±0.25 at s1."""
    from dreamgym.rl.batch import TurnRow, grpo_advantages
    from dreamgym.rl.rollout import Episode, Turn
    from dreamgym.types import Task

    def episode(reward: float, group: int = 0) -> Episode:
        e = Episode(task=Task(task_id="t", instruction="x"), group_id=group, seed=0, source="real")
        for i, state in enumerate(["s0", "s1"]):
            r = reward if i == 1 else 0.0
            e.turns.append(Turn(state, [], [1], [2], [0.0], "", "a", True, "s2", r, r, i == 1, False, {}))
        return e

    eps = [episode(1.0), episode(0.5)]
    rows = [TurnRow([1], [2], [0.0]) for _ in range(4)]
    assert grpo_advantages(eps, rows, normalize_std=False) == {}
    assert [r.advantage for r in rows] == pytest.approx([0.25, 0.25, -0.25, -0.25])
    stats = grpo_advantages(eps, rows, normalize_std=False, step_weight=1.0, step_gamma=0.5)
    assert [r.advantage for r in rows] == pytest.approx([0.375, 0.5, -0.375, -0.5])
    assert stats == {"step_groups": 2.0, "step_grouped_share": 1.0}
    # the step rewards are the ones RL optimises: with the invalid penalty on the step, the task's rewards
    stats = grpo_advantages(eps, rows, normalize_std=False, invalid_penalty_mode="step", step_weight=0.5,
                            step_gamma=0.5)
    assert [r.advantage for r in rows] == pytest.approx([0.3125, 0.375, -0.3125, -0.375])
    assert RLConfig().step_advantage_weight == 0.0 and RLConfig().step_gamma == 0.95
    with pytest.raises(ValueError, match="step_advantage_weight"):
        RLConfig(algo="ppo", step_advantage_weight=1.0)


def test_outcome_reward_pays_success_only_and_keeps_the_penalties_and_the_env_reward() -> None:
    """reward="success": a purchase with partial credit (0.6, not a success) pays 0, a success pays 1, whatever the
    graded score; the invalid turn keeps its 0.1 penalty, and env_reward (what trajectories record) is unchanged."""
    from dreamgym.rl.batch import TurnRow, grpo_advantages

    eps = [_two_turn_episode(0.6, invalid_first=True), _two_turn_episode(1.0, invalid_first=False, success=True),
           _two_turn_episode(0.9, invalid_first=False)]
    rows = [TurnRow([1], [2], [0.0]) for _ in range(6)]
    grpo_advantages(eps, rows, normalize_std=False)  # graded: shaped returns 0.5, 1.0, 0.9 (mean 0.8)
    assert [r.advantage for r in rows[::2]] == pytest.approx([-0.3, 0.2, 0.1])
    for e in eps:
        e.use_outcome_reward()
    eps[0].use_outcome_reward()  # idempotent: the penalty is not taken twice
    assert [t.reward for e in eps for t in e.turns] == pytest.approx([-0.1, 0.0, 0.0, 1.0, 0.0, 0.0])
    assert [e.env_return for e in eps] == pytest.approx([0.6, 1.0, 0.9])  # the env's own numbers stay
    assert eps[1].to_trajectory().transitions[-1].reward == 1.0 and eps[0].to_trajectory().transitions[-1].reward == 0.6
    grpo_advantages(eps, rows, normalize_std=False)  # outcome: shaped returns -0.1, 1, 0 (mean 0.3)
    assert [r.advantage for r in rows[::2]] == pytest.approx([-0.4, 0.7, -0.3])
    grpo_advantages(eps, rows, normalize_std=False, invalid_penalty_mode="step")  # returns 0, 1, 0 (mean 1/3)
    assert [r.advantage for r in rows] == pytest.approx([-1 / 3 - 0.1, -1 / 3, 2 / 3, 2 / 3, -1 / 3, -1 / 3])
    assert RLConfig().reward == "env" and RLConfig(reward="success").reward == "success"
    with pytest.raises(ValueError, match="reward"):
        RLConfig(reward="graded")


def test_real_latency_is_paid_by_training_rollouts_and_logged(sft_run: Path, tmp_path: Path) -> None:
    summary = train(config(sft_run, real_latency_s=0.01, real_sessions=4, iterations=2, save_every=2),
                    tmp_path / "run")
    rows = metrics(tmp_path / "run")
    rollouts = [list(read_jsonl(tmp_path / "run" / "rollouts" / f"iter_{i:05d}.jsonl")) for i in (1, 2)]
    # every episode's reset and every step paid 0.01 s, cumulative over iterations
    waits = [(len(r) + sum(t.num_steps for t in r)) * 0.01 for r in rollouts]
    assert [m["real_wait_s"] for m in rows] == pytest.approx([waits[0], waits[0] + waits[1]])
    assert rows[0]["real_env_s"] >= 0.01 * 2  # at least one reset and one step batch, slept
    assert 0 < rows[0]["wall_s"] < rows[1]["wall_s"] and rows[1]["real_env_s"] < rows[1]["wall_s"]
    assert summary["real_wait_s"] == pytest.approx(waits[0] + waits[1]) and summary["wall_s"] == rows[1]["wall_s"]
    assert {"real_env_s", "seconds", "real_transitions"} <= set(summary)
