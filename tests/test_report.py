"""dreamgym.report: RUN/report.html from a hand-made run dir (no training), escaped, and loads in Chromium."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import chromium_path

from dreamgym.report import write_bench_report, write_report

EVIL = "<script>alert('x')</script>"


def fake_run(run: Path) -> Path:
    run.mkdir()
    table = {
        "env": "shop", "env_kwargs": {"num_products": 100},
        "offline_data": {"trajectories": 60, "transitions": 425, "success_rate": 0.8667},
        "rows": [
            {"method": "SFT", "real_transitions": 0, "success_rate": 0.125, "mean_reward": 0.5, "seconds": 16.5},
            {"method": "GRPO (real)", "real_transitions": 47,
             "success_rate": {"mean": 0.25, "ci_low": 0.125, "ci_high": 0.375}, "mean_reward": 0.6, "seconds": 77.0},
            {"method": "DreamGym", "real_transitions": 0, "success_rate": 0.3125, "mean_reward": 0.7, "seconds": 600.0},
        ],
        "wm2real": {"episodes": 4, "reward_agreement": 0.75, "success_agreement": 0.5, "dreamt_success_rate": 0.5,
                    "real_success_rate": 0.25, "dreamt_mean_final_reward": 0.6, "real_mean_final_reward": 0.4},
    }
    fidelity = {
        "transitions": 36, "reward_accuracy": 0.4321, "reward_majority_baseline": 0.9166,
        "done_accuracy": 0.6944, "done_majority_baseline": 0.8765,
        "next_state_f1": 0.2718, "next_state_copy_baseline": {"f1": 0.1663},
        "next_state_f1_by_page": {"search": 0.05, "item": 0.6}, "transitions_by_page": {"search": 8, "item": 9},
        "side_by_side": [{
            "step": 1, "page": "item", "action": "click[<b>buy</b>]",
            "real_next_state": "[1] text: same line\n[2] text: real only " + EVIL,
            "dreamt_next_state": "[1] text: same line\n[2] text: dreamt only",
            "real_reward": 1.0, "dreamt_reward": 0.0, "real_done": True, "dreamt_done": False,
        }],
    }
    (run / "table.json").write_text(json.dumps(table))
    (run / "fidelity.json").write_text(json.dumps(fidelity))
    for row, wall in (("grpo_real", True), ("dreamgym", False)):
        (run / row).mkdir()
        lines = [{"iteration": i, "real_transitions": 24 * i, "success": 0.1 * i, "task_variances": [0.0, 0.1 * i],
                  **({"eval_success": 0.2 * i} if i % 2 == 0 else {}), **({"wall_s": 10.0 * i} if wall else {})}
                 for i in (1, 2, 3, 4)]
        (run / row / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{cut sh")
    (run / "dreamgym" / "rollouts").mkdir()
    traj = {"task": {"instruction": "buy " + EVIL}, "transitions": [
        {"action": "search[x]", "next_state": "[1] " + EVIL, "reward": 0.0}]}
    (run / "dreamgym" / "rollouts" / "iter_00001.jsonl").write_text(json.dumps(traj) + "\n")
    return run


def test_report_shows_the_run_and_escapes_its_text(tmp_path: Path) -> None:
    path = write_report(fake_run(tmp_path / "run"))
    assert path == tmp_path / "run" / "report.html"
    page = path.read_text()
    for text in ("Results", "GRPO (real)", "DreamGym", "0.250", "[0.125, 0.375]", "16.500",
                 "Experience model fidelity", "0.432", "0.917", "0.694", "0.876", "0.166",
                 "Dream-to-real agreement", "Dreamt vs real next states", "Dreamt rollouts",
                 "Success vs real transitions and wall-clock", "Curriculum group variances"):
        assert text in page, text
    # every accuracy sits in the same row as its trivial baseline
    assert "<td>reward_accuracy</td><td>0.432</td><td>0.917</td>" in page
    assert page.count("data:image/png;base64,") >= 5
    assert "<script" not in page and "&lt;script&gt;" in page and "&lt;b&gt;buy&lt;/b&gt;" in page
    assert "class='del'>[2] text: real only &lt;script&gt;" in page
    assert "class='add'>[2] text: dreamt only" in page
    assert "http://" not in page and "https://" not in page  # self-contained


def test_partial_and_missing_runs(tmp_path: Path) -> None:
    run = tmp_path / "partial"
    run.mkdir()
    (run / "table.json").write_text(json.dumps({"env": "shop", "rows": []}))
    assert "no rows yet" in write_report(run).read_text()
    (tmp_path / "empty").mkdir()
    for bad in (tmp_path / "empty", tmp_path / "nope"):
        with pytest.raises(ValueError):
            write_report(bad)


def test_cli_report(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run")
    r = subprocess.run([sys.executable, "-m", "dreamgym", "report", str(run)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert (run / "report.html").exists()
    r = subprocess.run([sys.executable, "-m", "dreamgym", "report", str(tmp_path / "nope")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_report_loads_in_headless_chromium(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    browser_path = chromium_path()
    if browser_path is None:
        pytest.skip("no system chromium on PATH (make install gets Debian's as root; apt-get install chromium)")
    path = write_report(fake_run(tmp_path / "run"))
    bench_path = write_bench_report(fake_bench(tmp_path / "bench"))
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            assert page.title().startswith("DreamGym report")
            assert page.locator("img").count() >= 5
            shot = page.screenshot(full_page=True)
            page.goto(bench_path.as_uri())
            assert page.title().startswith("DreamGym bench")
            assert page.locator("img").count() == 2
            bench_shot = page.screenshot(full_page=True)
        finally:
            browser.close()
    assert errors == []
    for png in (shot, bench_shot):
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def fake_bench(out: Path) -> Path:
    """A bench dir: bench.json over seeds 0 and 1 (SFT and one RL row), seed0 a full run dir, seed1 only metrics."""
    out.mkdir()
    fake_run(out / "seed0")
    (out / "seed1" / "grpo_real").mkdir(parents=True)
    (out / "seed1" / "grpo_real" / "metrics.jsonl").write_text(
        json.dumps({"iteration": 1, "real_transitions": 30, "eval_success": 0.5}) + "\n")
    tasks = {f"seed{s}": [{"episode": i, "task_id": i, "success": float(i < k), "reward": 0.5} for i in range(4)]
             for s, k in ((0, 1), (1, 3))}  # SFT's successes: 1 of 4 on seed 0, 3 of 4 on seed 1
    ci = {"mean": 0.5, "ci_low": 0.25, "ci_high": 0.75}
    rows = [{"row": "sft", "method": "SFT", "real_transitions": {"per_seed": [0, 0], "mean": 0},
             "synthetic_transitions": {"per_seed": [0, 0], "mean": 0}, "seconds": {"per_seed": [1, 3], "mean": 2},
             "success_rate": ci, "mean_reward": ci, "per_task": tasks, "vs_sft": None},
            {"row": "grpo_real", "method": "GRPO " + EVIL, "real_transitions": {"per_seed": [40, 60], "mean": 50},
             "synthetic_transitions": {"per_seed": [0, 0], "mean": 0}, "seconds": {"per_seed": [5, 7], "mean": 6},
             "success_rate": {"mean": 0.625, "ci_low": 0.375, "ci_high": 0.875}, "mean_reward": ci, "per_task": tasks,
             "vs_sft": {"diff": {"mean": 0.125, "ci_low": -0.25, "ci_high": 0.5}, "sign_test_p": 0.625}}]
    bench = {"command": "dreamgym bench --seeds 0,1", "env": "shop", "profile": "micro", "seeds": [0, 1],
             "episodes_per_seed": 4, "resamples": 2000, "bootstrap_seed": 0, "rows": rows,
             "baseline": {"policy": "random", "success_rate": {"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0},
                          "mean_reward": ci},
             "seeds_detail": {"seed0": {"stage_seconds": {"sft": 100.0, "grpo_real": 20.0}, "total_seconds": 120.0,
                                        "fidelity": {"done_accuracy": 0.945, "done_majority_baseline": 0.931,
                                                     "invalid_output_rate": 0.036}}}}
    (out / "bench.json").write_text(json.dumps(bench))
    return out


def test_bench_report_shows_the_table_seeds_and_curves(tmp_path: Path) -> None:
    path = write_bench_report(fake_bench(tmp_path / "bench"))
    assert path == tmp_path / "bench" / "report.html"
    page = path.read_text()
    for text in ("DreamGym bench: shop (micro profile), seeds 0, 1", "dreamgym bench --seeds 0,1",
                 "0.625 <span class='muted'>[0.375, 0.875]</span>", "+0.125 <span class='muted'>[-0.250, +0.500]",
                 "0.625", "trivial baseline (random policy)", "Per seed", "Success during training"):
        assert text in page, text
    # per-seed successes come from the raw per-task results: 1/4 on seed 0, 3/4 on seed 1
    assert "<tr><td>0</td><td>0.250</td><td>0.250</td>" in page and "<tr><td>1</td><td>0.750</td>" in page
    assert "<td>2.0</td>" in page  # seed 0's stages took 120 s in all; seed 1 has no detail
    assert "<td>0.945 / 0.931, 0.036</td>" in page  # seed 0's fidelity, from bench.json's seeds_detail
    assert "<a href='seed0/report.html'>" not in page  # seed0's own report has not been written yet
    assert page.count("data:image/png;base64,") == 2  # the CI plot and the curves
    assert "<script" not in page and "GRPO &lt;script&gt;" in page
    assert "http://" not in page and "https://" not in page
    with pytest.raises(ValueError, match="not a bench dir"):
        write_bench_report(tmp_path / "bench" / "seed1")


def test_cli_report_of_a_bench_dir(tmp_path: Path) -> None:
    out = fake_bench(tmp_path / "bench")
    write_report(out / "seed0")
    r = subprocess.run([sys.executable, "-m", "dreamgym", "report", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<a href='seed0/report.html'>" in page
