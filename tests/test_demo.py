"""The end-to-end test: `dreamgym demo --profile micro` runs the whole pipeline on a fresh directory, writes
Table 1 and the plot, and a rerun is served from the cached stages; a rerun under another config is refused,
and with --force redoes the stages that depend on the changed field only (tests/test_stage_cache.py: the rest)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dreamgym.pipeline import DemoConfig, demo_config
from dreamgym.sft import SFTConfig


def run_demo(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dreamgym", "demo", "--profile", "micro", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=1500)


def test_micro_demo_end_to_end_and_cached_rerun(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    r = run_demo(out)
    assert r.returncode == 0, r.stderr[-3000:]
    table = json.loads((out / "table.json").read_text())
    rows = {row["method"]: row for row in table["rows"]}
    assert list(rows) == ["SFT", "GRPO (real)", "DreamGym", "DreamGym-S2R"]
    report = (out / "report.html").read_text()  # written by every demo run
    assert all(row in report for row in rows) and "Experience model fidelity" in report
    for row in rows.values():
        assert set(row) == {"method", "real_transitions", "success_rate", "mean_reward", "seconds"}
        assert 0.0 <= row["success_rate"] <= 1.0
    assert rows["DreamGym"]["real_transitions"] == 0  # trained in the dream only
    # the shop's micro policy clones from the shipped base: it succeeds at all (the micro model's was 0 in every row),
    # and every row's final greedy evaluation stays below half invalid actions
    assert rows["SFT"]["success_rate"] > 0
    for stage in ("sft", "grpo_real", "dreamgym", "s2r"):
        marker = json.loads((out / f"stages/{stage}.json").read_text())
        assert (marker["evals"][-1] if "evals" in marker else marker)["invalid_action_rate"] < 0.5
    # the experience model's data: the offline episodes and 40% more at noise 0.8 (the shop's extra_behaviour)
    collect = json.loads((out / "stages/collect.json").read_text())
    extra = json.loads((out / "stages/collect_extra.json").read_text())["extra"]
    assert collect["trajectories"] == 60 and extra == [{**extra[0], "noise": 0.8, "trajectories": 24}]
    assert len((out / "offline_annotated.jsonl").read_text().splitlines()) == 60 + 24
    assert rows["GRPO (real)"]["real_transitions"] > 0 and rows["DreamGym-S2R"]["real_transitions"] > 0
    dream = json.loads((out / "dreamgym" / "summary.json").read_text())
    assert dream["synthetic_transitions"] > 0 and dream["eval_transitions"] > 0
    assert (out / "success_vs_real.png").stat().st_size > 1000
    assert (out / "curriculum_variance.png").stat().st_size > 1000
    dream_metrics = [json.loads(line) for line in (out / "dreamgym" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= v <= 0.25 for m in dream_metrics for v in m["task_variances"])
    assert (out / "experience_model" / "experience.json").exists()
    assert "DreamGym-S2R" in r.stdout  # the printed table
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "stages").glob("*.json")}
    again = run_demo(out)
    assert again.returncode == 0
    assert again.stderr.count("cached") == 9  # every stage served from its marker: nothing is retrained
    assert {p: p.stat().st_mtime_ns for p in (out / "stages").glob("*.json")} == mtimes
    assert json.loads((out / "table.json").read_text())["rows"] == table["rows"]
    # budgets are epochs/iterations; the micro profile sets no time cap, and the summaries say none fired
    for stage in ("train_exp", "sft"):
        assert json.loads((out / f"stages/{stage}.json").read_text())["time_cap_fired"] is False

    config = (out / "demo_config.yaml").read_text()
    refused = run_demo(out, "--set", "dream_iterations=1")
    errors = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr and len(errors) == 1, refused.stderr[-2000:]
    assert "stage 'DreamGym' was made with dream_iterations=2, this config has 1; rerun with --force" in errors[0]
    assert (out / "demo_config.yaml").read_text() == config  # the evidence is kept
    forced = run_demo(out, "--set", "dream_iterations=1", "--force")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert forced.stderr.count("cached") == 7  # collect ... GRPO-real reused; DreamGym and S2R (its dependent) redone
    redone = {p.stem for p, t in mtimes.items() if p.stat().st_mtime_ns != t}
    assert redone == {"dreamgym", "s2r"}
    assert json.loads((out / "dreamgym" / "summary.json").read_text())["iterations"] == 1
    assert run_demo(out, "--set", "dream_iterations=1").stderr.count("cached") == 9


def test_demo_config_layers_profile_file_and_overrides(tmp_path: Path) -> None:
    assert demo_config("default").env_kwargs == {"num_products": 1000}
    micro = demo_config("micro")
    assert (micro.env, micro.env_kwargs, micro.policy["offer_task_search"]) == ("shop", {"num_products": 100}, True)
    path = tmp_path / "tw.yaml"
    path.write_text("env: textworld\nenv_kwargs: {num_train_games: 3}\nnoise: 0.2\n")
    cfg = demo_config("micro", {"noise": 0.1}, path)
    assert cfg.env_kwargs == {"num_train_games": 3} and cfg.noise == 0.1  # the file over the profile, --set over both
    assert cfg.offline_episodes == 60  # the profile's size fields stay...
    assert cfg.policy["offer_task_search"] is False and cfg.dream["task_generator"] == "none"  # ...its shop ones go
    path.write_text("env: [textworld\n")
    with pytest.raises(ValueError, match=r"tw.yaml:2: invalid YAML"):
        demo_config("default", None, path)


def test_textworld_bench_configs_load_and_weigh_terminal_steps() -> None:
    """configs/textworld-bench.yaml (the bench's) and configs/exp-textworld-bench.yaml (its M_exp alone) validate, and
    their mixture keys are kinds TextWorld steps really get: a key no step has would silently weigh nothing."""
    from dreamgym.experience.train import ExpTrainConfig, mix, step_kinds
    from dreamgym.types import Task, Trajectory, Transition, read_yaml_mapping

    root = Path(__file__).resolve().parent.parent / "configs"
    cfg = demo_config("default", {"env": "textworld"}, root / "textworld-bench.yaml")
    assert (cfg.env, cfg.exp_model, cfg.policy_model, cfg.env_kwargs["settings"]) == (
        "textworld", "pretrained", "pretrained", {"go": 1, "recipe": 2, "take": 2})
    exp = ExpTrainConfig.model_validate(read_yaml_mapping(root / "exp-textworld-bench.yaml", "train-exp config"))
    assert exp.mixture == cfg.exp_mixture and exp.protocol == cfg.exp_protocol
    state = "location: Kitchen\n[c1] command: eat meal"
    steps = [Transition(state=state, action="look", next_state=state, reward=0.0, done=False),
             Transition(state=state, action="eat meal", next_state=state, reward=1.0, done=True)]
    traj = Trajectory(task=Task(task_id="t", instruction="cook", env="textworld"), transitions=steps, success=True)
    kinds = step_kinds([traj])
    assert kinds == ["state", "state:success"]
    assert mix(["look", "eat"], kinds, dict(exp.mixture or {})) == ["look", "eat", "eat", "eat"]  # type: ignore[arg-type]


def test_shop_bench_config_is_the_600s_recipe_over_the_demo() -> None:
    """configs/shop-bench.yaml validates and changes the policy's warm start only: the compact prompt with word
    answers, on-path cloning with option steps x12, 2,100 steps of 16 at lr 2e-3 (bc_options.py's recipe); every
    M_exp, RL and dream field stays the demo's default, so the bench's rows differ from the demo's by the SFT alone."""
    root = Path(__file__).resolve().parent.parent / "configs"
    cfg = demo_config("default", None, root / "shop-bench.yaml")
    default = demo_config("default")
    assert cfg.policy == {**default.policy, "prompt": "compact", "answer_words": True}
    assert (cfg.bc_decision_repeat, cfg.bc_on_path) == (12, True)
    sft = SFTConfig(**cfg.sft)
    assert (sft.max_steps, sft.batch_size, sft.learning_rate, sft.group_by_length) == (2100, 16, 2e-3, True)
    changed = {k for k in DemoConfig.model_fields if getattr(cfg, k) != getattr(default, k)}
    assert changed == {"policy", "bc_decision_repeat", "bc_on_path", "sft"}
