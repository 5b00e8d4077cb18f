"""A user's env, written outside the repository, works from the CLI and in the pipeline through public names
only: the README's example env runs through ``dreamgym --import FILE demo --config``, an installed package's
``dreamgym.envs`` entry point registers its env for every command, and an env without an oracle or an
explainer falls back to ``random`` collection and ``diff`` annotation."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_example(tmp_path: Path) -> tuple[Path, Path]:
    text = README.read_text()
    files = []
    for name, lang in (("doors.py", "python"), ("doors.yaml", "yaml")):
        match = re.search(r"<!-- example-env: " + re.escape(name) + r"[^>]*-->\n```" + lang + r"\n(.*?)```", text, re.S)
        assert match, f"README lost its {name} example"
        (tmp_path / name).write_text(match.group(1))
        files.append(tmp_path / name)
    return files[0], files[1]


def dreamgym(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dreamgym", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env={**os.environ, **(env or {})})


def test_the_readme_example_env_is_short_and_registers_with_public_names(tmp_path: Path) -> None:
    code, _ = readme_example(tmp_path)
    assert len(code.read_text().splitlines()) <= 40
    assert "_REGISTRY" not in code.read_text() and "dreamgym.register(" in code.read_text()


@pytest.mark.slow
def test_the_readme_example_env_runs_the_whole_demo(tmp_path: Path) -> None:
    code, config = readme_example(tmp_path)
    run = dreamgym("--import", code.name, "demo", "--profile", "micro", "--config", config.name, "--out", "run",
                   cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    table = json.loads((tmp_path / "run" / "table.json").read_text())
    assert table["env"] == "doors"
    assert [r["method"] for r in table["rows"]] == ["SFT", "GRPO (real)", "DreamGym", "DreamGym-S2R"]
    # no oracle: collected by the random policy, which opens the right door of three about a third of the time
    assert table["offline_data"]["policies"] == ["random"]
    assert 0.1 < table["offline_data"]["success_rate"] < 0.7
    # no explainer: the diff annotator wrote one trace per step, naming the action it explains
    annotate = json.loads((tmp_path / "run" / "stages" / "annotate.json").read_text())
    assert annotate["annotator"] == "diff" and annotate["steps"] == table["offline_data"]["transitions"]
    first = json.loads((tmp_path / "run" / "offline_annotated.jsonl").read_text().splitlines()[0])
    step = first["transitions"][0]
    assert step["info"]["reasoning"].startswith(f'"{step["action"]}" listed: valid')
    assert "no noisy oracle" in run.stderr


def test_an_installed_packages_entry_point_registers_its_env_for_every_command(tmp_path: Path) -> None:
    code, _ = readme_example(tmp_path)
    site = tmp_path / "site"
    (site / "doors_pkg").mkdir(parents=True)
    (site / "doors_pkg" / "__init__.py").write_text(code.read_text())
    dist = site / "doors_pkg-0.1.dist-info"  # what pip writes for a package with this in its pyproject.toml
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: doors-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[dreamgym.envs]\ndoors = doors_pkg\n")
    pythonpath = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    run = dreamgym("eval", "--env", "doors", "--policy", "random", "--split", "test", "--episodes", "30", "--json",
                   cwd=tmp_path, env={"PYTHONPATH": pythonpath})
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["episodes"] == 30 and 0.1 < result["success_rate"] < 0.7
    listed = dreamgym("env", "list", cwd=tmp_path, env={"PYTHONPATH": pythonpath})
    assert "doors" in listed.stdout


def test_without_the_import_the_env_is_unknown_and_a_bad_import_is_one_line(tmp_path: Path) -> None:
    readme_example(tmp_path)
    unknown = dreamgym("eval", "--env", "doors", "--policy", "random", "--episodes", "1", cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown env 'doors'" in unknown.stderr and "--import" in unknown.stderr
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    broken = dreamgym("--import", "broken.py", "env", "list", cwd=tmp_path)
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert "--import broken.py: RuntimeError: boom" in broken.stderr
    missing = dreamgym("env", "list", "--import", "no_such_module_xyz", cwd=tmp_path)
    assert missing.returncode == 2 and "no_such_module_xyz" in missing.stderr and "Traceback" not in missing.stderr
    after = dreamgym("eval", "--env", "doors", "--policy", "random", "--episodes", "3", "--json", "--import",
                     "doors.py", cwd=tmp_path)  # --import after the command works too
    assert after.returncode == 0, after.stderr


def test_the_demo_refuses_an_oracle_the_env_lacks_in_one_line(tmp_path: Path) -> None:
    code, config = readme_example(tmp_path)
    run = dreamgym("--import", code.name, "demo", "--profile", "micro", "--config", config.name, "--set",
                   "collect_policy=noisy", "--out", "run", cwd=tmp_path)
    assert run.returncode == 2 and "no scripted policy 'noisy'" in run.stderr and "Traceback" not in run.stderr


def test_the_demo_takes_the_users_own_offline_file(tmp_path: Path) -> None:
    """A pre-collected file replaces the collection stage (no oracle needed); its summary is the file's."""
    import dreamgym as dg
    from dreamgym.collect import iter_episodes
    from dreamgym.pipeline import demo_config, summarize_file
    from dreamgym.types import write_jsonl

    env = dg.make("shop", num_products=50)
    trajs = list(iter_episodes(env, env.scripted_policy("oracle"), 5, "train", 0))
    write_jsonl(tmp_path / "mine.jsonl", trajs)
    cfg = demo_config("micro", {"offline_file": str(tmp_path / "mine.jsonl")})
    assert cfg.offline_file == tmp_path / "mine.jsonl"
    summary = summarize_file(tmp_path / "mine.jsonl")
    assert summary["trajectories"] == 5 and summary["policies"] == ["oracle"] and summary["success_rate"] == 1.0
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no trajectories"):
        summarize_file(tmp_path / "empty.jsonl")


def test_an_env_whose_reset_forgets_the_task_is_told_the_cause() -> None:
    from dreamgym.envs import TextEnv

    class Forgetful(TextEnv):
        name = "forgetful"

        def _reset(self, task, split):  # type: ignore[no-untyped-def]
            return "[1] text: hello", {}

    with pytest.raises(TypeError, match=r"Forgetful._reset must set self.task"):
        Forgetful().reset(seed=0)


def test_register_takes_only_envspec_fields_and_specs_say_what_they_hold() -> None:
    import dreamgym
    from dreamgym.envs import spec

    with pytest.raises(TypeError, match="EnvSpec fields are name, entry_point, policies"):
        dreamgym.register("typo", "x:Y", explainr="x:f")
    shop = spec("shop")
    assert shop.load("explainer").__module__ == "dreamgym.envs.shop.explain"
    assert spec("agentgym").load("explainer") is None and spec("agentgym").demo_defaults == {}
    with pytest.raises(ValueError, match="unknown env 'nope'"):
        spec("nope")
