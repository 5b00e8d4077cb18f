"""`dreamgym bench`: the statistics against known values (and a cheat), bad input through the CLI, and one
end-to-end micro bench (2 seeds, 3 rows) that resumes from its stage markers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dreamgym.bench import parse_seeds
from dreamgym.pipeline import DEFAULT_ROWS, active_stages, demo_config, parse_rows
from dreamgym.stats import bootstrap_ci, paired_bootstrap_ci, sign_test, wilson_interval


def test_sign_test_known_values() -> None:
    # 8 of 10 discordant pairs favour A: p = 2 * (C(10,0) + C(10,1) + C(10,2)) / 2^10 = 112 / 1024
    a, b = [1] * 8 + [0] * 2 + [1] * 5, [0] * 8 + [1] * 2 + [1] * 5  # 5 ties are dropped
    assert sign_test(a, b) == {"a_better": 8, "b_better": 2, "p": 0.109375}
    assert sign_test(b, a)["p"] == 0.109375  # two-sided
    assert sign_test([1] * 6, [0] * 6)["p"] == pytest.approx(2 / 64)
    assert sign_test([1, 0, 1], [0, 1, 1])["p"] == 1.0  # balanced: p capped at 1
    assert sign_test([0.5, 0.5], [0.5, 0.5])["p"] == 1.0  # no discordant pair


def test_wilson_interval_known_values() -> None:
    # 28 of 64 and 370 of 420: the values statsmodels' proportion_confint(method="wilson") gives
    assert wilson_interval(28, 64) == pytest.approx((0.32294, 0.55914), abs=1e-5)
    assert wilson_interval(370, 420) == pytest.approx((0.84648, 0.90852), abs=1e-5)
    low, high = wilson_interval(0, 20)
    assert low == 0.0 and 0.1 < high < 0.2  # never below 0, and not empty at 0 successes
    assert wilson_interval(20, 20)[1] == 1.0
    with pytest.raises(ValueError):
        wilson_interval(5, 0)


def test_bootstrap_ci_constant_and_spread() -> None:
    assert bootstrap_ci([[1.0] * 7, [1.0] * 5]) == {"mean": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    rng = np.random.default_rng(1)
    values = [rng.integers(0, 2, 200).tolist() for _ in range(3)]
    ci = bootstrap_ci(values)
    assert ci == bootstrap_ci(values)  # seeded
    assert ci["ci_low"] < ci["mean"] < ci["ci_high"]
    # ~ mean +- 1.96 sqrt(p(1-p)/n) for 600 coin flips: half-width about 0.04
    assert 0.02 < (ci["ci_high"] - ci["ci_low"]) / 2 < 0.07
    # the seed level carries the between-seed spread: seeds far apart widen the CI
    apart = bootstrap_ci([[0.0] * 50, [1.0] * 50, [0.5] * 50])
    assert apart["ci_high"] - apart["ci_low"] > 0.3
    with pytest.raises(ValueError):
        bootstrap_ci([[]])


def test_paired_comparison_and_the_identical_rows_cheat() -> None:
    rng = np.random.default_rng(2)
    sft = [rng.integers(0, 2, 40).tolist() for _ in range(3)]
    # a row with exactly SFT's per-task outcomes: no difference, whatever the outcomes are
    same = paired_bootstrap_ci(sft, [list(x) for x in sft])
    assert same["ci_low"] <= 0 <= same["ci_high"] and same == {"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0}
    flat = [x for xs in sft for x in xs]
    assert sign_test(flat, list(flat))["p"] == 1.0
    # a row that succeeds everywhere SFT fails: a clearly positive difference
    better = [[1] * 40 for _ in range(3)]
    diff = paired_bootstrap_ci(better, sft)
    assert diff["ci_low"] > 0 and diff["mean"] == pytest.approx(1 - np.mean(flat))
    with pytest.raises(ValueError, match="same seeds and tasks"):
        paired_bootstrap_ci([[1, 0]], [[1]])


def test_paired_refuses_rows_that_played_other_tasks() -> None:
    """``dreamgym.bench.paired`` (the bench's vs-SFT column and benchmarks/bench_pair.py) pairs by position, so a seed
    whose two lists hold other task ids, or the same ones in another order, is refused, never silently misaligned."""
    from dreamgym.bench import paired

    a = [{"task_id": f"t{i}", "success": i % 2, "reward": 0.5} for i in range(6)]
    ok = paired({"seed0": a}, {"seed0": [dict(t, success=1) for t in a]})
    assert ok["worse"] == 3 and ok["better"] == 0 and ok["diff"]["mean"] == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="seed 0: the two sides played different tasks"):
        paired({0: a}, {0: a[::-1]})
    with pytest.raises(ValueError, match="different tasks"):
        paired({"seed0": a}, {"seed0": a[:5]})


def test_bench_partial_pairs_a_stopped_rows_latest_evaluation_with_sft(tmp_path: Path) -> None:
    """benchmarks/bench_partial.py: a stopped RL row's latest evaluation (RUN/ROW/eval_tasks.json) minus SFT's on the
    same tasks, with the iteration it was made at; other tasks, or no run dir, are a one-line error (exit 2)."""
    import yaml

    run = tmp_path / "seed0"
    (run / "sft").mkdir(parents=True)
    (run / "dreamgym").mkdir()
    (run / "demo_config.yaml").write_text(yaml.safe_dump(demo_config("default").model_dump()))
    (run / "random_baseline.json").write_text(json.dumps({"success_rate": 0.0, "per_task": []}))
    sft = [{"episode": i, "task_id": f"t{i}", "success": i < 2, "reward": float(i < 2)} for i in range(10)]
    row = [dict(t, success=i < 5, reward=float(i < 5)) for i, t in enumerate(sft)]
    (run / "sft" / "eval_tasks.json").write_text(json.dumps({"iteration": 0, "per_task": sft}))
    (run / "dreamgym" / "eval_tasks.json").write_text(json.dumps({"iteration": 3, "per_task": row}))
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_partial.py"
    out = tmp_path / "partial.json"
    done = subprocess.run([sys.executable, str(script), str(run), "dreamgym", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["row_iteration"] == 3 and result["random_policy_success"] == 0.0
    assert result["row_minus_sft"]["better"] == 3 and result["row_minus_sft"]["worse"] == 0
    assert result["row_minus_sft"]["diff"]["mean"] == pytest.approx(0.3)
    (run / "dreamgym" / "eval_tasks.json").write_text(json.dumps({"iteration": 3, "per_task": row[::-1]}))
    for argv in ([str(run), "dreamgym"], [str(tmp_path / "nope"), "dreamgym"]):
        bad = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_rl_outcomes_counts_each_tasks_move_between_success_partial_and_zero(tmp_path: Path) -> None:
    """benchmarks/rl_outcomes.py: per setting (run dirs grouped without their -s<seed>), each task's greedy outcome
    before and after; start and end on other tasks, or a missing evaluation, are a one-line error (exit 2)."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "rl_outcomes.py"
    start = [(True, 1.0), (True, 1.0), (False, 0.5), (False, 0.0), (False, 0.0)]
    end = [(True, 1.0), (False, 0.75), (True, 1.0), (False, 0.5), (False, 0.0)]
    runs = []
    for seed in (0, 1):
        run = tmp_path / f"lr=3e-4-s{seed}"
        run.mkdir()
        for name, outcomes in (("eval_tasks_start.json", start), ("eval_tasks.json", end)):
            per_task = [{"episode": i, "task_id": f"t{i}", "success": s, "reward": r} for i, (s, r) in enumerate(outcomes)]
            (run / name).write_text(json.dumps({"iteration": 0, "per_task": per_task}))
        runs.append(str(run))
    out = tmp_path / "outcomes.json"
    done = subprocess.run([sys.executable, str(script), *runs, "--out", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    entry = json.loads(out.read_text())["settings"]["lr=3e-4"]
    assert entry["tasks"] == 10 and entry["before"] == {"success": 4, "partial": 2, "zero": 4}
    assert entry["after"] == {"success": 4, "partial": 4, "zero": 2}
    assert entry["moves"]["success->partial"] == 2 and entry["moves"]["partial->success"] == 2
    assert entry["moves"]["zero->partial"] == 2 and sum(entry["moves"].values()) == 6
    (tmp_path / "lr=3e-4-s1" / "eval_tasks.json").write_text(json.dumps({"per_task": []}))
    (tmp_path / "lr=3e-4-s0" / "eval_tasks_start.json").unlink()
    for argv in (runs[1:], runs[:1]):
        bad = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_group_signal_counts_groups_whose_purchases_differ_in_what_decides_success(tmp_path: Path) -> None:
    """benchmarks/group_signal.py, on two hand-made groups: one whose episodes buy two options of the same product
    (one wins: a choice signal), one whose episodes all buy the same thing and win (no variance at all); a rollout
    line that is not an episode is a one-line error (exit 2)."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "group_signal.py"

    def episode(task: str, options: str | None, success: bool) -> dict[str, Any]:
        page = "[1] text: B0AAAAAA — Blue Mug\n[2] option: size=small" + (f" {options}" if options else "")
        steps = [{"state": "[1] searchbox: search[your query]", "action": "search[mug]", "next_state": page,
                  "reward": 0.0, "done": False},
                 {"state": page, "action": "click[buy now]", "next_state": "", "reward": 1.0 if success else 0.5,
                  "done": True}]
        return {"task": {"task_id": task, "instruction": "a blue mug"}, "transitions": steps, "success": success}

    run = tmp_path / "grpo_real"
    (run / "rollouts").mkdir(parents=True)
    group_a = [episode("a", "(selected)", True), episode("a", None, False), episode("a", None, False)]
    group_b = [episode("b", "(selected)", True)] * 3
    (run / "rollouts" / "iter_00001.jsonl").write_text("".join(json.dumps(e) + "\n" for e in group_a + group_b))
    out = tmp_path / "signal.json"
    done = subprocess.run([sys.executable, str(script), str(run), "--out", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    total = json.loads(out.read_text())["total"]
    assert total == {"groups": 2, "reward_varies": 1, "mixed_success": 1, "purchases_differ_in_product": 0,
                     "purchases_differ_in_options": 1, "purchase_choice_decides": 1}
    (run / "rollouts" / "iter_00002.jsonl").write_text("{}\n")
    bad = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def fake_run(run: Path, outcomes: dict[int, dict[str, list[int]]]) -> Path:
    """A seed's run dir as the demo leaves it: each row's stage marker and per-task results (1 = success), the
    row's real transitions 10 x the seed and its seconds 1 + the seed."""
    seed = next(iter(outcomes))
    (run / "stages").mkdir(parents=True)
    for row, wins in outcomes[seed].items():
        (run / row).mkdir()
        per_task = [{"episode": i, "task_id": f"t{i}", "success": bool(w), "reward": float(w) * 0.9}
                    for i, w in enumerate(wins)]
        (run / row / "eval_tasks.json").write_text(json.dumps({"per_task": per_task}))
        (run / "stages" / f"{row}.json").write_text(json.dumps(
            {"method": row, "real_transitions": 10 * seed, "synthetic_transitions": 0, "stage_seconds": 1.0 + seed}))
    return run


def test_ablations_are_compared_with_dreamgym_task_by_task(tmp_path: Path) -> None:
    """An ablation row gets ``vs_dreamgym``: its success minus DreamGym's on the same tasks, so the sign of a
    component's effect is read from a paired test, not from two overlapping CIs; bench.md prints it as a table."""
    from dreamgym.bench import summarize_bench, write_markdown
    from dreamgym.report import write_bench_report

    outcomes = {"sft": [0, 0, 0, 0, 1, 1], "dreamgym": [1, 1, 1, 1, 1, 0], "no_replay": [0, 1, 0, 0, 1, 0],
                "grpo_real": [0, 0, 0, 0, 1, 1]}
    runs = {s: fake_run(tmp_path / f"seed{s}", {s: outcomes}) for s in (0, 1)}
    rows = summarize_bench(runs, ["sft", "grpo_real", "dreamgym", "no_replay"])
    by = {r["row"]: r for r in rows}
    ablation = by["no_replay"]["vs_dreamgym"]
    # per seed, against DreamGym no_replay loses tasks 0, 2 and 3 and wins none; against SFT it wins 1, loses 5
    assert (ablation["better"], ablation["worse"]) == (0, 6)
    assert ablation["diff"]["mean"] == pytest.approx(-0.5) and ablation["diff"]["ci_high"] < 0
    assert by["no_replay"]["vs_sft"]["diff"]["mean"] == pytest.approx(0.0)
    assert (by["no_replay"]["vs_sft"]["better"], by["no_replay"]["vs_sft"]["worse"]) == (2, 2)
    assert all("vs_dreamgym" not in by[r] for r in ("sft", "grpo_real", "dreamgym"))
    # without the dreamgym row there is nothing to compare an ablation with
    assert "vs_dreamgym" not in summarize_bench(runs, ["sft", "no_replay"])[1]
    bench = {"env": "shop", "profile": "default", "seeds": [0, 1], "command": "c", "episodes_per_seed": 6,
             "resamples": 2000, "bootstrap_seed": 0, "rows": rows}
    write_markdown(tmp_path / "bench.md", bench)
    assert "| no_replay | -0.500 [" in (tmp_path / "bench.md").read_text()
    (tmp_path / "bench.json").write_text(json.dumps(bench))  # report.html shows the same table
    page = write_bench_report(tmp_path).read_text()
    assert "<h2>Ablations</h2>" in page and "<td>no_replay</td><td>-0.500 <span class='muted'>[" in page
    assert "0 / 6" in page and page.count("<tr>") > len(rows)


MERGE_OUTCOMES = {0: {"sft": [0, 0, 1, 1, 0, 0], "grpo_real": [1, 0, 1, 1, 0, 0], "dreamgym": [1, 1, 1, 0, 0, 0]},
                  1: {"sft": [0, 1, 0, 0, 0, 1], "grpo_real": [0, 1, 1, 0, 0, 1], "dreamgym": [1, 1, 0, 1, 0, 1]},
                  2: {"sft": [1, 0, 0, 0, 0, 0], "grpo_real": [1, 0, 0, 1, 0, 0], "dreamgym": [1, 0, 1, 0, 1, 0]}}


def one_bench(tmp_path: Path, seeds: list[int], rows: list[str], **config: Any) -> dict[str, Any]:
    """bench.json as ``dreamgym bench --seeds <seeds>`` writes it over fake run dirs (:func:`fake_run`)."""
    from dreamgym.bench import baseline_entry, config_record, summarize_bench

    runs = {s: fake_run(tmp_path / f"{'_'.join(rows)}-seed{s}",
                        {s: {r: MERGE_OUTCOMES[s][r] for r in rows}}) for s in seeds}
    random = {s: [{"episode": i, "task_id": f"t{i}", "success": i == s, "reward": 0.0} for i in range(6)]
              for s in seeds}
    return {"command": "dreamgym bench", "env": "shop", "profile": "micro", "seeds": seeds, "episodes_per_seed": 6,
            "resamples": 2000, "bootstrap_seed": 0, "config": config_record(demo_config("micro", config)),
            "rows": summarize_bench(runs, rows), "baseline": baseline_entry(random),
            "seeds_detail": {f"seed{s}": {"total_seconds": 60.0 * (s + 1)} for s in seeds}}


def test_bench_merge_equals_one_bench_over_all_the_seeds(tmp_path: Path) -> None:
    """Seeds run apart (seed 0 in one session, seeds 1 and 2 in another) merge into the bench one run over the three
    seeds would have written: the same rows, CIs and paired tests, recomputed from the raw per-task results."""
    from dreamgym.bench import merge_benches

    rows = ["sft", "grpo_real", "dreamgym"]
    merged = merge_benches({"b12": one_bench(tmp_path / "b", [1, 2], rows), "a0": one_bench(tmp_path / "a", [0], rows)})
    whole = one_bench(tmp_path / "w", [0, 1, 2], rows)
    assert merged["seeds"] == [0, 1, 2] and merged["merged_from"] == {"b12": [1, 2], "a0": [0]}
    assert merged["rows"] == whole["rows"] and merged["baseline"] == whole["baseline"]
    assert merged["seeds_detail"] == whole["seeds_detail"] and merged["config"] == whole["config"]
    grpo = merged["rows"][1]
    assert grpo["real_transitions"] == {"per_seed": [0, 10, 20], "mean": 10.0}
    assert (grpo["vs_sft"]["better"], grpo["vs_sft"]["worse"]) == (3, 0)  # one task won on each seed
    # the rows every file ran, unless --rows names some; SFT always comes along for the pairing
    a, b = one_bench(tmp_path / "c", [0], rows), one_bench(tmp_path / "d", [1], ["sft", "dreamgym"])
    assert [r["row"] for r in merge_benches({"a": a, "b": b})["rows"]] == ["sft", "dreamgym"]
    assert [r["row"] for r in merge_benches({"a": a, "b": b}, rows=["dreamgym"])["rows"]] == ["dreamgym"]


@pytest.mark.parametrize(("change", "message"), [
    ({"seeds": [1]}, "seed 1 is in both a and b"),
    ({"config": {"sft": {"learning_rate": 0.5}}}, "b and a ran other configs: sft.learning_rate: 0.5 vs "),
    ({"config": {"eval_episodes": 7}}, "b and a ran other configs: eval_episodes: 7 vs "),
    ({"env": "textworld"}, "b and a differ in env: 'textworld' vs 'shop'"),
    ({"drop": "config"}, "b: no 'config' in it (written before bench.json recorded its config"),
    ({"rows": ["grpo_real"]}, "row 'grpo_real' is not in every bench (rows in all: sft, dreamgym)"),
    ({"per_task": True}, "b: not a complete bench.json (KeyError"),
])
def test_bench_merge_refuses_benches_that_are_not_one_config(tmp_path: Path, change: dict[str, Any],
                                                            message: str) -> None:
    from dreamgym.bench import merge_benches

    a = one_bench(tmp_path / "a", [1], ["sft", "dreamgym"])
    b = one_bench(tmp_path / "b", change.get("seeds", [2]), ["sft", "dreamgym"], **change.get("config", {}))
    if "sft" in change.get("config", {}):
        b["config"]["sft"] = {**a["config"]["sft"], **change["config"]["sft"]}
    b["env"] = change.get("env", b["env"])
    b.pop(change.get("drop", "-"), None)
    if change.get("per_task"):
        del b["rows"][1]["per_task"]["seed2"]
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        merge_benches({"a": a, "b": b}, rows=change.get("rows"))


def test_bench_merge_reads_a_config_written_before_a_field_existed(tmp_path: Path) -> None:
    """A field added to DemoConfig after a file was written takes its default, the behaviour that file ran with;
    the same field set to another value is still a different config."""
    from dreamgym.bench import merge_benches

    old = one_bench(tmp_path / "a", [0], ["sft"])
    assert old["config"]["bc_final_repeat"] == 1  # the field's default, in the micro profile too
    del old["config"]["bc_final_repeat"]  # as if written before the field existed
    assert merge_benches({"old": old, "new": one_bench(tmp_path / "b", [1], ["sft"])})["seeds"] == [0, 1]
    other = one_bench(tmp_path / "c", [2], ["sft"], bc_final_repeat=3)
    with pytest.raises(ValueError, match=r"^other and old ran other configs: bc_final_repeat: 3 vs 1$"):
        merge_benches({"old": old, "other": other})


def test_bench_merge_cli_writes_the_table_and_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    rows = ["sft", "dreamgym"]
    files = []
    for seeds in ([0], [1, 2]):
        files.append(tmp_path / f"bench{seeds[0]}.json")
        files[-1].write_text(json.dumps(one_bench(tmp_path / str(seeds[0]), seeds, rows)))
    out = tmp_path / "merged"

    def merge(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dreamgym", "bench-merge", *args], capture_output=True,
                              text=True, timeout=300)

    res = merge(*map(str, files), "--out", str(out))
    assert res.returncode == 0, res.stderr
    data = json.loads((out / "bench.json").read_text())
    assert data["seeds"] == [0, 1, 2] and data["command"].startswith("dreamgym bench-merge ")
    assert "seeds 0, 1, 2" in (out / "bench.md").read_text() and (out / "report.html").exists()
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "seeds.json").write_text(json.dumps({**json.loads(files[1].read_text()), "seeds": "1,2"}))
    for args, message in [([files[0], files[0]], f"error: {files[0]} is given twice"),
                          ([files[0], tmp_path / "bad.json"], f"error: {tmp_path / 'bad.json'}: not JSON"),
                          ([files[0]], "error: bench-merge needs two or more bench.json files"),
                          ([files[0], tmp_path / "seeds.json"], f"error: {tmp_path / 'seeds.json'}: not a bench.json "
                           "(its seeds are not a list of integers)"),
                          ([files[0], tmp_path / "none.json"], f"error: {tmp_path / 'none.json'}: No such file")]:
        res = merge(*map(str, args), "--out", str(tmp_path / "bad"))
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), res.stderr
    assert not (tmp_path / "bad").exists()


def test_rows_and_seeds_parse() -> None:
    assert parse_seeds("0, 1,2") == [0, 1, 2]
    assert parse_rows("sft,ppo_real") == ("sft", "ppo_real")
    assert demo_config("micro").rows == list(DEFAULT_ROWS)  # the demo is unchanged
    cfg = demo_config("micro", {"rows": ["sft", "s2r", "no_replay"]})
    assert active_stages(cfg) == ["collect", "collect_extra", "annotate", "train_exp", "fidelity", "sft", "grpo_real",
                                  "dreamgym", "s2r", "train_exp_no_replay", "no_replay"]  # the shop's extra behaviour


def bench(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dreamgym", "bench", "--profile", "micro", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=1800)


@pytest.mark.parametrize(("args", "message"), [
    (["--rows", "sft,bogus"], "error: unknown row 'bogus'; choose from sft, grpo_real"),
    (["--env", "nowhere"], "error: unknown env 'nowhere'; registered: "),
    (["--seeds", "0,one"], "error: --seeds expects comma-separated integers like 0,1,2, got '0,one'"),
    (["--seeds", ""], "error: --seeds expects comma-separated integers"),
    (["--seeds", "-1"], "error: --seeds: a seed must be >= 0, got -1"),
    (["--set", "seed=4"], "error: seed: set by the bench's --env/--seeds/--rows"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    res = bench(tmp_path / "b", *args)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), res.stderr
    assert not (tmp_path / "b").exists()  # nothing ran


# the smallest micro settings: 4 test episodes, no fidelity stage, one RL iteration, one dream iteration, the micro
# policy (the bench's mechanics, not what the base's policy learns: tests/test_demo.py runs the micro profile as is)
SMALL = ["--set", "eval_episodes=4", "--set", "heldout_episodes=0", "--set", "offline_episodes=30",
         "--set", "policy_model=micro", "--set", "sft={epochs: 2, learning_rate: 0.003, batch_size: 16, num_threads: 2}",
         "--set", "dream_iterations=1", "--set",
         "rl={iterations: 1, tasks_per_iter: 2, group_size: 2, eval_every: 0, num_threads: 2, max_steps: 6, "
         "minibatch_size: 32}"]


@pytest.mark.slow
def test_micro_bench_two_seeds_end_to_end_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    res = bench(out, "--seeds", "0,1", "--rows", "sft,grpo_real,dreamgym", *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads((out / "bench.json").read_text())
    assert data["env"] == "shop" and data["seeds"] == [0, 1] and data["command"].startswith("dreamgym bench")
    assert [r["row"] for r in data["rows"]] == ["sft", "grpo_real", "dreamgym"]
    assert [r["method"] for r in data["rows"]] == ["SFT", "GRPO (real)", "DreamGym"]
    for r in data["rows"]:
        for key in ("real_transitions", "synthetic_transitions", "seconds"):
            assert len(r[key]["per_seed"]) == 2 and r[key]["mean"] == pytest.approx(sum(r[key]["per_seed"]) / 2)
        for key in ("success_rate", "mean_reward"):
            assert set(r[key]) == {"mean", "ci_low", "ci_high"}
            assert r[key]["ci_low"] <= r[key]["mean"] <= r[key]["ci_high"]
        assert set(r["per_task"]) == {"seed0", "seed1"}
        for seed, tasks in r["per_task"].items():
            assert len(tasks) == 4 and all(set(t) == {"episode", "task_id", "success", "reward"} for t in tasks)
            # the same test tasks, in the same order, as SFT's on that seed: pairable
            assert [t["task_id"] for t in tasks] == [t["task_id"] for t in data["rows"][0]["per_task"][seed]]
            success = np.mean([t["success"] for t in tasks])
            assert success == pytest.approx(json.loads((out / seed / "table.json").read_text())["rows"][
                [x["row"] for x in data["rows"]].index(r["row"])]["success_rate"])
    sft, grpo, dream = data["rows"]
    assert sft["vs_sft"] is None
    assert sft["real_transitions"]["per_seed"] == [0, 0] and min(grpo["real_transitions"]["per_seed"]) > 0
    assert dream["real_transitions"]["per_seed"] == [0, 0] and min(dream["synthetic_transitions"]["per_seed"]) > 0
    for r in (grpo, dream):
        assert set(r["vs_sft"]) >= {"diff", "sign_test_p"} and 0 <= r["vs_sft"]["sign_test_p"] <= 1
        assert set(r["vs_sft"]["diff"]) == {"mean", "ci_low", "ci_high"}
    assert data["baseline"]["policy"] == "random"
    for seed in ("seed0", "seed1"):  # how long each seed's demo took, stage by stage, and its M_exp's fidelity
        detail = data["seeds_detail"][seed]
        assert set(detail["stage_seconds"]) == {"collect", "collect_extra", "annotate", "train_exp", "sft", "grpo_real",
                                                "dreamgym"}
        assert detail["total_seconds"] == pytest.approx(sum(detail["stage_seconds"].values()), abs=0.2)
    md = (out / "bench.md").read_text()
    assert "| SFT |" in md and "DreamGym" in md and "random policy" in md
    assert "dreamgym bench on shop" in res.stdout  # the rich table (its title; the columns wrap at 80 chars)
    page = (out / "report.html").read_text()  # the bench's report links each seed's own
    assert "DreamGym bench: shop" in page and "<a href='seed1/report.html'>" in page and (out / "seed1" /
                                                                                         "report.html").exists()

    # a rerun resumes: every stage of both seeds is reused from its marker, nothing is retrained
    markers = {p: p.stat().st_mtime_ns for p in out.glob("seed*/stages/*.json")}
    again = bench(out, "--seeds", "0,1", "--rows", "sft,grpo_real,dreamgym", *SMALL)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("cached") == 2 * 7  # collect, collect_extra, annotate, train_exp, sft, grpo_real, dreamgym
    assert {p: p.stat().st_mtime_ns for p in out.glob("seed*/stages/*.json")} == markers
    assert json.loads((out / "bench.json").read_text())["rows"] == data["rows"]


def test_a_dream_row_restarted_without_a_checkpoint_starts_from_a_fresh_copy_of_the_buffer(tmp_path: Path) -> None:
    """The dream row adds its rollouts to a copy of M_exp's buffer. An attempt killed before its first checkpoint
    leaves its synthetic rows in that copy; the restart, which begins at iteration 0, must not retrieve them. A
    row that resumes from a checkpoint keeps its copy (the checkpoint hides what was written after it)."""
    from dreamgym.pipeline import copy_dream_buffer

    buffer, dream, run = tmp_path / "buffer", tmp_path / "dream_buffer", tmp_path / "dreamgym"
    buffer.mkdir()
    (buffer / "records.jsonl").write_text("offline\n")
    assert copy_dream_buffer(buffer, dream, run) and (dream / "records.jsonl").read_text() == "offline\n"
    (dream / "records.jsonl").write_text("offline\nsynthetic of a killed attempt\n")
    run.mkdir()
    assert copy_dream_buffer(buffer, dream, run) and (dream / "records.jsonl").read_text() == "offline\n"
    (dream / "records.jsonl").write_text("offline\nsynthetic before the checkpoint\n")
    (run / "checkpoint").mkdir()
    assert not copy_dream_buffer(buffer, dream, run)
    assert (dream / "records.jsonl").read_text() == "offline\nsynthetic before the checkpoint\n"
    assert not list(tmp_path.glob("*.partial"))


def test_refit_reward_head_adds_a_head_only_to_a_copy(tmp_path: Path) -> None:
    """benchmarks/refit_reward_head.py --add marks a config as having a reward head, so it must never rewrite the
    run's own: without --copy-to it is a one-line error (exit 2), as is a seed dir without a trained M_exp."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "refit_reward_head.py"
    (tmp_path / "seed0").mkdir()
    for argv, why in ((["--add"], "--add needs --copy-to"),
                      (["--copy-to", str(tmp_path / "new"), "--add"], "holds no trained experience_model")):
        bad = subprocess.run([sys.executable, str(script), str(tmp_path / "seed0"), *argv], capture_output=True,
                             text=True, timeout=120)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
        assert why in bad.stderr  # the guard that fired, not another one-line error before or after it
    assert not (tmp_path / "new").exists()



def test_serve_budget_pairs_the_two_servings_by_seed_and_refuses_an_untrained_seed(tmp_path: Path) -> None:
    """benchmarks/serve_budget.py: a seed dir without a trained M_exp is a one-line error (exit 2) that writes
    nothing (prompt_layouts.py's too); its paired summary is each seed's ``budget - before`` with their mean."""
    import importlib.util

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "serve_budget.py"
    (tmp_path / "seed0").mkdir()
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "seed0"), "--out", str(tmp_path / "o.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    assert "holds no trained experience_model" in bad.stderr and not (tmp_path / "o.json").exists()
    spec = importlib.util.spec_from_file_location("serve_budget", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = [{"before": {"next_state_f1": 0.90, "done_accuracy": None}, "budget": {"next_state_f1": 0.93,
                                                                               "done_accuracy": None}},
            {"before": {"next_state_f1": 0.80, "done_accuracy": None}, "budget": {"next_state_f1": 0.81,
                                                                               "done_accuracy": None}}]
    for r in rows:
        for side in r.values():
            side.update({k: side.get(k) for k in module.KEYS})
    layouts = script.parent / "prompt_layouts.py"
    bad = subprocess.run([sys.executable, str(layouts), str(tmp_path / "seed0"), "--budget", "512"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    trained = tmp_path / "trained"
    (trained / "experience_model").mkdir(parents=True)
    (trained / "experience_model" / "summary.json").write_text(json.dumps({"protocol": {"k": 1}}))
    for protocol in ('{"no_such_field": 1}', "[1]", "{not json"):
        bad = subprocess.run([sys.executable, str(layouts), str(trained), "--budget", "512", "--protocol", protocol],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and bad.stderr.startswith("error: --protocol") and "Traceback" not in bad.stderr
    bad = subprocess.run([sys.executable, str(script.parent / "exp_val.py"), str(tmp_path / "seed0"), "--out",
                          str(tmp_path / "v.json")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    assert "holds no trained experience_model" in bad.stderr and not (tmp_path / "v.json").exists()
    f1 = module.paired(rows)["next_state_f1"]
    assert f1["per_seed"] == [0.03, 0.01] and f1["mean"] == pytest.approx(0.02) and "done_accuracy" not in module.paired(rows)

def test_bench_pair_compares_two_rows_of_one_bench_task_by_task(tmp_path: Path) -> None:
    """benchmarks/bench_pair.py --rows A B: row A minus row B on the same tasks (here of one bench.json); a row the
    bench lacks is a one-line error (exit 2)."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_pair.py"

    def row(name: str, wins: list[int]) -> dict[str, Any]:
        tasks = [{"task_id": f"t{i}", "success": bool(w), "reward": float(w)} for i, w in enumerate(wins)]
        return {"row": name, "method": name, "per_task": {"seed0": tasks, "seed1": tasks}}

    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": [row("dreamgym", [1, 1, 1, 0]), row("grpo_real", [1, 0, 0, 0])]}))
    out = tmp_path / "pair.json"
    done = subprocess.run([sys.executable, str(script), str(bench), str(bench), "--rows", "dreamgym", "grpo_real",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads(out.read_text())["rows"]
    assert entry["row"] == "dreamgym - grpo_real" and entry["new_minus_old"]["better"] == 4
    assert entry["new_minus_old"]["worse"] == 0 and entry["new_minus_old"]["diff"]["mean"] == pytest.approx(0.5)
    bad = subprocess.run([sys.executable, str(script), str(bench), str(bench), "--rows", "dreamgym", "ppo_real"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_dream_signal_counts_the_groups_grpo_cannot_learn_from(tmp_path: Path) -> None:
    """benchmarks/dream_signal.py: per RL iteration, the groups whose rewards did not vary (zero advantages under
    GRPO), with the run's wm2real; a dir without metrics.jsonl, or a line that is not JSON, is a one-line error."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "dream_signal.py"
    run = tmp_path / "dreamgym"
    run.mkdir()
    lines = [{"iteration": 1, "success": 1.0, "task_variances": [0.0, 0.0, 0.109375], "grad_norm": 0.0},
             {"iteration": 2, "success": 0.5, "task_variances": [0.25, 0.0], "grad_norm": 0.4},
             {"iteration": 2, "eval_success": 0.2}]  # an evaluation line: not an RL iteration
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (run / "summary.json").write_text(json.dumps({"wm2real": {"episodes": 4, "invalid_in_real": 3}}))
    (run / "rollouts").mkdir()
    pages = ["location: Kitchen\n[c1] command: take egg\n[c2] command: take egg",  # the item offered twice
             "location: Kitchen\n[c1] command: take egg\n[c2] command: take milk"]
    (run / "rollouts" / "iter_00001.jsonl").write_text(json.dumps({"transitions": [{"next_state": p} for p in pages]}))
    # TextWorld meals: made with milk missing (a page the real game never writes), refused, and made with both
    egg, both, meal = "[i1] carrying: an egg", "[i1] carrying: an egg\n[i2] carrying: some milk", "[i1] carrying: a meal"
    recipe = {"task": {"env": "textworld", "instruction": "Cook! (ingredients: egg (fried), milk)"}, "transitions": [
        {"state": egg, "action": "prepare meal", "next_state": meal},
        {"state": egg, "action": "prepare meal", "next_state": egg},
        {"state": egg, "action": "take milk", "next_state": both},
        {"state": both, "action": "prepare meal", "next_state": meal},
        # opening a container: reveals the recipe's milk; offers only an apple; offers milk the page already offered
        {"state": egg, "action": "open fridge", "next_state": f"{egg}\n[c1] command: take milk from fridge",
         "info": {"recalled": True}},  # answered from the offline data (DreamConfig.recall)
        {"state": egg, "action": "open fridge", "next_state": f"{egg}\n[c1] command: take apple from fridge"},
        {"state": egg, "action": "open fridge", "next_state": f"{egg}\n[c1] command: take milk from fridge"},  # M_exp's
        {"state": f"{egg}\n[c1] command: take milk from fridge", "action": "open fridge",
         "next_state": f"{egg}\n[c1] command: take milk from fridge\n[c2] command: close fridge"}], "success": True}
    paid_anyway = {"task": recipe["task"], "success": True, "transitions": recipe["transitions"][:1]}
    paid_no_meal = {"task": recipe["task"], "success": True, "transitions": recipe["transitions"][2:3]}
    (run / "rollouts" / "iter_00003.jsonl").write_text(json.dumps(recipe) + "\n" + json.dumps(paid_anyway) + "\n"
                                                          + json.dumps(paid_no_meal) + "\n")
    # the run's real data (config.yaml's dream.offline_data): this game's fridge, opened, offered the milk
    real = {"task": recipe["task"], "transitions": [recipe["transitions"][6]]}
    (tmp_path / "real.jsonl").write_text(json.dumps(real) + "\n")
    (run / "config.yaml").write_text(f"dream: {{offline_data: [{tmp_path / 'real.jsonl'}]}}\n")
    out = tmp_path / "signal.json"
    done = subprocess.run([sys.executable, str(script), str(run), "--out", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())["runs"][0]
    assert (report["groups"], report["zero_variance_groups"], report["zero_variance_share"]) == (5, 3, 0.6)
    assert [r["zero_variance_groups"] for r in report["iterations"]] == [2, 1] and report["mean_success"] == 0.75
    assert report["wm2real"]["invalid_in_real"] == 3 and "3 of 4 replayed" in done.stdout
    assert report["rollout_pages"] == {"pages": 12, "repeated_element_pages": 1, "recalled_pages": 1}
    # the last iteration's file only (iter_00001's episode, no action and no success, is not counted)
    assert report["last_endings"] == {"open won": 1, "prepare won": 1, "take won": 1}
    assert report["meals"] == {"ready_made": 1, "ready_refused": 0, "missing_made": 2, "missing_refused": 1,
                               "paid_episodes": 3, "paid_after_ready_meal": 1, "paid_after_missing_meal_only": 1,
                               "paid_without_meal": 1, "opens": 4, "opens_revealing_ingredient": 2,
                               "opens_recalled": 1, "opens_generated_revealing": 1,
                               # of the 3 generated opens (all on record) only the one offering the milk reads the
                               # game; "no ingredient" and "every ingredient" (egg and milk) match none
                               "opens_generated_on_record": 3, "opens_generated_as_recorded": 1,
                               "opens_as_recorded_if_none": 0, "opens_as_recorded_if_all": 0}
    assert "meals made with an ingredient missing 2 of 3 such prepares" in done.stdout
    assert ("2 of 4 opens offered a recipe ingredient (1 opens recalled; 1 of the 3 generated offered one); of 3 "
            "generated opens the data also made in their game, 1 offered the ingredients a recorded one did (no "
            "ingredient would match 0, every one 0)" in done.stdout)
    # TextWorld's reading of each step (TextEnv.had_effect): only the refused prepare changed nothing but the
    # feedback (the pages of iter_00001, whose task names no env, are not read)
    assert report["no_effect"] == {"steps": 10, "no_effect": 1, "prepare_meal": 4, "prepare_meal_no_effect": 1}
    assert "1 of 10 valid non-final steps changed nothing but the feedback (1 of 4 prepares)" in done.stdout
    data = subprocess.run([sys.executable, str(script), str(run), "--data", str(run / "rollouts" / "iter_00001.jsonl"),
                           "--data", str(tmp_path / "nothing.jsonl")], capture_output=True, text=True, timeout=120)
    assert data.returncode == 2 and "nothing.jsonl: no such trajectory file" in data.stderr
    (tmp_path / "real.jsonl").unlink()  # the run's real data gone: a one-line error, not a silent count
    gone = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=120)
    assert gone.returncode == 2 and "offline data is not there" in gone.stderr
    (run / "config.yaml").unlink()
    (run / "rollouts" / "iter_00002.jsonl").write_text("{not json\n")
    bad = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "iter_00002.jsonl:1: not a trajectory" in bad.stderr
    (run / "metrics.jsonl").write_text("{not json\n")
    for bad_run in (run, tmp_path / "missing"):
        bad = subprocess.run([sys.executable, str(script), str(bad_run)], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_open_probe_asks_m_exp_the_dreams_generated_opens_the_real_data_also_made(tmp_path: Path) -> None:
    """benchmarks/open_probe.py: the probes are a dream's generated (not recalled) ``open X`` steps in games whose real
    data opened X; each M_exp's page is scored against the recorded opens, beside "no ingredient" and "every
    ingredient"; a second M_exp is paired with the first; a run without real data is a one-line error (exit 2)."""
    from dreamgym.experience.protocol import ProtocolConfig
    from dreamgym.experience.train import train_experience_model
    from dreamgym.replay import HashingEncoder, ReplayBuffer
    from dreamgym.sft import SFTConfig
    from dreamgym.types import Task, Trajectory, Transition, write_jsonl

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "open_probe.py"
    cook = "Cook! (ingredients: egg (fried), milk)"
    kitchen = "location: Kitchen\n[i1] carrying: an egg\n[c1] command: open fridge\n[c2] command: open cupboard"

    def traj(i: int, instruction: str, steps: list[tuple[str, str]], info: dict[str, Any] | None = None) -> Trajectory:
        return Trajectory(traj_id=f"T{i}", task=Task(task_id=instruction, instruction=instruction, env="textworld"),
                          transitions=[Transition(state=kitchen, action=a, next_state=f"{kitchen}\n{page}", reward=0.0,
                                                  done=False, info=info or {}) for a, page in steps])

    milk = "[c3] command: take milk from fridge"
    opened = ("location: Kitchen\n[f] feedback: You open the fridge, revealing some milk.\n[i1] carrying: an egg\n"
              "[c1] command: close fridge\n[c2] command: open cupboard\n[c3] command: take milk from fridge")
    real = [Trajectory(traj_id=f"R{i}", task=Task(task_id=cook, instruction=cook, env="textworld"), transitions=[
        Transition(state=kitchen, action="open fridge", next_state=opened, reward=0.0, done=False)]) for i in range(2)]
    write_jsonl(tmp_path / "real.jsonl", real)
    run = tmp_path / "dream"
    (run / "rollouts").mkdir(parents=True)
    (run / "config.yaml").write_text(f"dream: {{offline_data: [{tmp_path / 'real.jsonl'}]}}\n")
    write_jsonl(run / "rollouts" / "iter_00001.jsonl", [
        traj(2, cook, [("open fridge", "[c3] command: close fridge")]),  # a probe: generated, the data opened it
        traj(3, cook, [("open fridge", milk)], info={"recalled": True}),  # recalled: not M_exp's page
        traj(4, cook, [("open cupboard", "[c3] command: close cupboard")]),  # the data never opened the cupboard
        traj(5, "Look around.", [("open fridge", milk)])])  # no recipe
    seed = tmp_path / "seed0"
    sft = SFTConfig(max_steps=1, batch_size=2, max_length=512, num_threads=1, save_steps=100000)
    train_experience_model([tmp_path / "real.jsonl"], "micro", seed / "experience_model",
                           ProtocolConfig(k=1, reasoning=False, task_neighbours=True), sft, vocab_size=512)
    with ReplayBuffer.open(seed / "buffer", HashingEncoder()) as buffer:
        buffer.add_trajectories(real)
    out = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, str(script), str(seed), str(seed), "--rollouts", str(run), "--out", str(out),
                           "--effect-max-commands", "16"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["probes"] == 1 and [r["probes"] for r in report["seeds"]] == [1, 1]
    first, second = report["seeds"]
    assert (first["if_none"], first["if_all"]) == (0, 0)  # the fridge held the milk alone
    assert first["as_recorded"] == second["as_recorded"] in (0, 1) and first["protocol"]["task_neighbours"] is True
    assert first["served_with_neighbour"] == 1  # the short prompt keeps the same game's open
    assert second["vs_first"] == {"won": 0, "lost": 0, "sign_test_p": 1.0}  # the same M_exp, the same pages
    assert "of 1 dreamt opens offered the ingredients a recorded open did" in done.stdout
    # the recorded effect, each real open answered from the other: the game's page; the page unchanged matches none
    assert report["effect_on_real"] == {"real_opens": 2, "with_another_record": 2, "answered": 2, "page_as_real": 2,
                                        "unchanged_as_real": 0}
    (run / "config.yaml").unlink()
    bad = subprocess.run([sys.executable, str(script), str(seed), "--rollouts", str(run)], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "not a dream run" in bad.stderr and "Traceback" not in bad.stderr
    no_model = subprocess.run([sys.executable, str(script), str(tmp_path), "--rollouts", str(run)],
                              capture_output=True, text=True, timeout=120)
    assert no_model.returncode == 2 and len(no_model.stderr.strip().splitlines()) == 1


def test_dream_neighbours_counts_the_dreamt_opens_recall_or_the_tasks_rows_could_answer(tmp_path: Path) -> None:
    """benchmarks/dream_neighbours.py: of the dreamt ``open`` steps, those the data recorded (recall answers them),
    and of the rest those whose game opened the same container elsewhere, with how often retrieval finds it; a run
    without rollouts is a one-line error (exit 2)."""
    from dreamgym.types import Task, Trajectory, Transition, write_jsonl

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "dream_neighbours.py"

    def traj(i: int, game: str, state: str, action: str = "open fridge") -> Trajectory:
        return Trajectory(traj_id=f"T{i}", task=Task(task_id=game, instruction=f"cook in {game}", env="toy"),
                          transitions=[Transition(state=state, action=action, next_state=f"{game}'s fridge",
                                                  reward=0.0, done=False)])

    data = tmp_path / "data.jsonl"
    write_jsonl(data, [traj(0, "A", "kitchen"), traj(1, "B", "hall")])
    seed = tmp_path / "seed0"
    (seed / "experience_model").mkdir(parents=True)
    (seed / "experience_model" / "summary.json").write_text(json.dumps({"data": [str(data)], "encoder": "hashing"}))
    dream = seed / "dreamgym"
    (dream / "rollouts").mkdir(parents=True)
    dreamt = [traj(2, "A", "kitchen"),  # recorded: recall answers it
              traj(3, "A", "kitchen with a knife"), traj(4, "B", "kitchen"),  # unrecorded; the data opened both
              traj(5, "C", "kitchen"), traj(6, "A", "kitchen", action="take egg")]  # game C never did; not an open
    write_jsonl(dream / "rollouts" / "iter_00001.jsonl", dreamt)
    out = tmp_path / "n.json"
    done = subprocess.run([sys.executable, str(script), str(seed), str(dream), "--k", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert (report["steps"], report["recorded"], report["unrecorded"], report["task_action_in_data"]) == (4, 1, 3, 2)
    assert report["retrieved_task_action"]["task_first"] == {"top1": 2, "any_of_1": 2}
    assert report["retrieved_task_action"]["phi"]["top1"] <= 2
    bad = subprocess.run([sys.executable, str(script), str(seed), str(tmp_path / "nothing")], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
