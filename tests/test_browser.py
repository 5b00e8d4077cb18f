"""The WebArena path: the shop site, make("browser") over real Chromium, the browser oracle, WebArena's evaluators.

Skips (like tests/test_report.py) when Playwright or a system Chromium is missing. One site and one env are
shared by most tests (a Chromium launch costs ~2 s on 2 cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import chromium_path

from dreamgym.envs.shop.reward import ShopGoal, purchase_reward
from dreamgym.envs.web.site import ShopSiteConfig, create_site
from dreamgym.envs.web.webarena import (
    UnsupportedTask,
    exact_match,
    load_tasks,
    must_include,
    string_match,
    url_match,
)

SITE = ShopSiteConfig(num_products=100, num_tasks_per_split=20)


def needs_browser() -> None:
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    pytest.importorskip("psutil", reason="psutil is not installed (the dev extra)")
    if chromium_path() is None:
        pytest.skip("no system chromium on PATH (make install gets Debian's as root; apt-get install chromium)")


def browser_children() -> list[str]:
    import psutil

    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "chrom" in proc.name().lower() or "playwright" in " ".join(proc.cmdline()).lower():
                out.append(f"{proc.pid} {proc.name()}")
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def site_url() -> Iterator[str]:
    from dreamgym.envs.server import BackgroundServer

    with BackgroundServer(create_site(SITE)) as url:
        yield url


@pytest.fixture(scope="module")
def env(site_url: str) -> Iterator[object]:
    needs_browser()
    import dreamgym

    browser_env = dreamgym.make("browser", start_url=site_url, timeout_s=5.0)
    yield browser_env
    browser_env.close()


# ------------------------------------------------------------------------------------------- the site

def test_site_serves_pages_and_scores_a_purchase(site_url: str) -> None:
    task = SITE.tasks("test")[0]
    goal = ShopGoal.from_dict(task.goal)
    with httpx.Client(base_url=site_url, timeout=10) as client:
        start = client.get(f"/start?task={task.task_id}", follow_redirects=True)
        assert start.status_code == 200 and "<input type='search'" in start.text and task.instruction in start.text
        sid = str(start.url).split("/")[-2]
        results = client.get(f"/s/{sid}/results", params={"q": task.instruction})
        assert "Page 1 (results" in results.text and "Next &gt;" in results.text
        item = client.get(f"/s/{sid}/item/{goal.asin}", params={"q": "x", "p": 1})
        assert "role='radio'" in item.text or not goal.options
        assert "Buy Now" in item.text and "Description" in item.text
        assert client.get("/api/result", params={"session": sid}).json()["done"] is False
        options = [f"{n}:{v}" for n, v in goal.options.items()]
        bought = client.post(f"/s/{sid}/buy", data={"asin": goal.asin, "o": options}, follow_redirects=True)
        assert "Thank you for shopping" in bought.text
        result = client.get("/api/result", params={"session": sid}).json()
        assert result == {**result, "done": True, "reward": 1.0, "success": True}
        # the same session cannot buy twice; another purchase scores as the text shop scores it
        client.post(f"/s/{sid}/buy", data={"asin": "B0NOTREAL"})
        assert client.get("/api/result", params={"session": sid}).json()["reward"] == 1.0
        sid2 = str(client.get(f"/start?task={task.task_id}", follow_redirects=True).url).split("/")[-2]
        other = next(p for p in create_site(SITE).state.site.catalog.products if p.category != goal.category)
        client.post(f"/s/{sid2}/buy", data={"asin": other.asin})
        assert client.get("/api/result", params={"session": sid2}).json()["reward"] == pytest.approx(
            purchase_reward(goal, other, {}).total)
        assert client.get("/start?task=nope").status_code == 404
        assert client.get("/s/nosuchsession/search").status_code == 404
        assert client.get("/api/result", params={"session": "x"}).status_code == 404


# -------------------------------------------------------------------------------------- the browser env

def test_observation_has_bids_roles_and_actions(env) -> None:
    from dreamgym.envs.base import parse_elements

    obs, info = env.reset(seed=0, options={"split": "test"})
    elements = parse_elements(obs)
    roles = {e.type for e in elements}
    assert {"searchbox", "button", "text"} <= roles and all(e.id.isdigit() for e in elements)
    box = next(e for e in elements if e.type == "searchbox")
    typed = [a for a in info["admissible_actions"] if a.startswith(f"type[{box.id}][")]
    assert len(typed) >= 1 and f"type[{box.id}][{info['task'].instruction}]" not in typed  # the shop's examples
    assert env.action_valid_for_state(obs, f"type[{box.id}][anything]") and not env.action_valid_for_state(obs, "click[5000]")
    obs, reward, terminated, truncated, info = env.step(f"type[{box.id}][face moisturizer]")
    assert not info["invalid_action"] and "/results?" in info["url"]
    links = [e for e in parse_elements(obs) if e.type == "link"]
    assert any(e.text.startswith("B0") for e in links) and f"click[{links[-1].id}]" in info["admissible_actions"]
    assert "go_back" in info["admissible_actions"]
    product = next(e for e in links if e.text.startswith("B0"))
    obs, *_ = env.step(f"click[{product.id}]")
    radios = [e for e in parse_elements(obs) if e.type == "radio"]
    assert radios and not any("(checked)" in e.text for e in radios)
    obs, reward, terminated, truncated, info = env.step(f"click[{radios[0].id}]")
    assert "(checked)" in next(e for e in parse_elements(obs) if e.type == "radio").text
    # go_back is offered while an episode page lies behind this one, and not past the first page
    backs = 0
    while "go_back" in info["admissible_actions"] and backs < 6:
        obs, reward, terminated, truncated, info = env.step("go_back")
        assert not info["invalid_action"]
        backs += 1
    assert any(e.type == "searchbox" for e in parse_elements(obs)) and 2 <= backs < 6
    assert env.step("go_back")[4]["invalid_action"]
    png = env.screenshot()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_bid_and_malformed_actions_are_counted_invalid(env) -> None:
    obs, _ = env.reset(seed=1, options={"split": "test"})
    before = env.stats["invalid_actions"]
    for action in ("click[99999]", "type[99999][x]", "select[1]", "dance", "click[]"):
        obs2, reward, terminated, truncated, info = env.step(action)
        assert info["invalid_action"] and obs2 == obs and reward == 0.0 and not terminated, action
        assert info["last_action_error"]
    assert env.stats["invalid_actions"] == before + 5
    # a real element that refuses the action (a button cannot be typed into) is invalid too, not an exception
    button = next(e for e in env.elements if e.role == "button")
    assert env.step(f"type[{button.bid}][x]")[4]["invalid_action"]


def test_oracle_solves_test_tasks_and_random_does_not(env) -> None:
    from dreamgym.collect import evaluate_scripted

    oracle = evaluate_scripted(env, env.scripted_policy("oracle"), episodes=4, split="test", seed=3)
    assert oracle.success_rate == 1.0 and oracle.invalid_action_rate == 0.0
    rand = evaluate_scripted(env, env.scripted_policy("random", seed=0), episodes=2, split="test", seed=3)
    assert rand.success_rate == 0.0


def test_a_browser_crash_fails_the_episode_and_the_next_one_relaunches(env) -> None:
    import psutil

    env.reset(seed=2, options={"split": "test"})
    failed = env.stats["failed_episodes"]
    for proc in env._procs:  # the env's own chromium and driver processes
        with contextlib.suppress(psutil.Error):
            proc.kill()
    box = next(e for e in env.elements if e.editable)
    obs, reward, terminated, truncated, info = env.step(f"type[{box.bid}][coffee]")
    assert terminated and reward == 0.0 and "browser_error" in info
    assert env.stats["failed_episodes"] == failed + 1
    obs, info = env.reset(seed=2, options={"split": "test"})
    assert "searchbox" in obs and "browser_error" not in info


def test_unreachable_site_is_a_one_line_error_or_a_counted_failure(tmp_path: Path) -> None:
    needs_browser()
    import socket

    import dreamgym
    from dreamgym.envs.server import BackgroundServer

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ValueError, match="unreachable") as caught:
        dreamgym.make("browser", start_url=f"http://127.0.0.1:{port}", timeout_s=2)
    assert "\n" not in str(caught.value)
    cli = subprocess.run([sys.executable, "-m", "dreamgym", "eval", "--env", "browser", "--env-arg",
                          f"start_url=http://127.0.0.1:{port}", "--episodes", "1", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "Traceback" not in cli.stderr and len(cli.stderr.strip().splitlines()) == 1
    # the site goes away after the env was made: the episode is a counted, logged failure, without hanging
    server = BackgroundServer(create_site(SITE))
    env = dreamgym.make("browser", start_url=server.start(), timeout_s=3, retries=1)
    try:
        server.stop()
        obs, info = env.reset(seed=0, options={"split": "test"})
        assert "browser error" in obs and "browser_error" in info
        assert env.step("click[1]")[2] is True and env.stats["failed_episodes"] == 1
    finally:
        env.close()


def test_close_leaves_no_chromium_process(site_url: str) -> None:
    needs_browser()
    import psutil

    import dreamgym

    others = set(browser_children())  # the shared env's browser, if it runs
    env = dreamgym.make("browser", start_url=site_url)
    env.reset(seed=0, options={"split": "test"})
    ours = list(env._procs)
    assert any("chrom" in p.name().lower() for p in ours), "the env should run a browser"
    env.close()
    env.close()  # idempotent
    assert not [p for p in ours if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert set(browser_children()) <= others


# ------------------------------------------------------------------------------------------- WebArena

def test_webarena_string_and_url_evaluators() -> None:
    assert exact_match("Quest Lumaflex Band", ' "quest lumaflex band" ') == 1.0
    assert exact_match("a", "b") == 0.0
    assert must_include("0", "0") == 1.0 and must_include("0", "10", tokenize=True) == 0.0
    assert string_match({"must_include": ["red", "blue"]}, "Red and BLUE") == 1.0
    assert string_match({"must_include": ["red", "green"]}, "red and blue") == 0.0
    with pytest.raises(UnsupportedTask, match="LLM"):
        string_match({"fuzzy_match": ["x"]}, "x")
    assert url_match("http://h:1/s?q=red", "http://h:1/s/abc/results?q=red&p=1") == 1.0
    assert url_match("http://h:1/s?q=red |OR| http://h:1/x", "http://h:1/s/abc/results?q=blue") == 0.0
    assert url_match("http://h:1/item", "http://h:1/s/abc/results") == 0.0


def _webarena_tasks(folder: Path, goal: ShopGoal, task_id: str) -> Path:
    """Hand-made tasks in WebArena's format about our shop (one per evaluator, one unsupported)."""
    start = f"__SHOPPING__/start?task={task_id}"
    tasks = [
        {"task_id": 1, "sites": ["shopping"], "start_url": start, "intent": "What is the cheapest product's id?",
         "storage_state": None, "eval": {"eval_types": ["string_match"],
                                         "reference_answers": {"exact_match": goal.asin}}},
        {"task_id": 2, "sites": ["shopping"], "start_url": start, "intent": f"Search for {goal.category}",
         "eval": {"eval_types": ["url_match"], "reference_url": f"__SHOPPING__/s?q={goal.category}",
                  "url_note": "GOLD in PRED"}},
        {"task_id": 3, "sites": ["shopping"], "start_url": start, "intent": f"Buy {goal.asin}",
         "eval": {"eval_types": ["program_html"], "program_html": [
             {"url": "last", "locator": "", "required_contents": {"must_include": ["Thank you for shopping"]}},
             {"url": "last", "locator": "document.querySelector('main').innerText",
              "required_contents": {"must_include": [f"{goal.asin} |OR| nothing"]}}]}},
        {"task_id": 4, "sites": ["shopping"], "start_url": start, "intent": "judge me",
         "eval": {"eval_types": ["string_match"], "reference_answers": {"fuzzy_match": ["x"]}}},
    ]
    folder.mkdir()
    for task in tasks:
        (folder / f"{task['task_id']}.json").write_text(json.dumps(task))
    return folder


def test_webarena_tasks_on_our_shop(tmp_path: Path, site_url: str) -> None:
    needs_browser()
    import dreamgym

    task = SITE.tasks("test")[0]
    goal = ShopGoal.from_dict(task.goal)
    folder = _webarena_tasks(tmp_path / "config_files", goal, task.task_id)
    with pytest.raises(ValueError, match="url_map"):
        load_tasks(folder)
    assert [t.task_id for t in load_tasks(folder, {"shopping": site_url})["test"]] == \
        ["webarena-1", "webarena-2", "webarena-3"]  # the fuzzy_match task is skipped
    env = dreamgym.make("browser", tasks=str(folder), url_map={"SHOPPING": site_url}, timeout_s=5)
    try:
        def element(role: str, prefix: str = "") -> str:
            return next(e.bid for e in env.elements if e.role == role and e.name.startswith(prefix))

        env.reset(options={"task": "webarena-1", "split": "test"})
        assert env.step(f"stop[{goal.asin}]")[1:3] == (1.0, True)
        env.reset(options={"task": "webarena-1", "split": "test"})
        assert env.step("stop[B0WRONG]")[1] == 0.0
        env.reset(options={"task": "webarena-2", "split": "test"})
        env.step(f"type[{element('searchbox')}][{goal.category}]")
        assert env.step("stop[]")[1] == 1.0
        env.reset(options={"task": "webarena-3", "split": "test"})
        assert env.step("stop[]")[1] == 0.0  # nothing bought
        env.reset(options={"task": "webarena-3", "split": "test"})
        env.step(f"type[{element('searchbox')}][{task.instruction}]")
        env.step(f"click[{element('link', goal.asin)}]")
        obs, reward, terminated, truncated, info = env.step(f"click[{element('button', 'Buy')}]")
        assert not terminated and reward == 0.0  # WebArena scores when the agent stops
        assert env.step("stop[done]")[1] == 1.0
    finally:
        env.close()


# ------------------------------------------------------------------------------------ the pipeline

def test_collect_and_annotate_through_the_browser(tmp_path: Path, site_url: str) -> None:
    needs_browser()
    from dreamgym.types import read_trajectories

    data, annotated = tmp_path / "offline.jsonl", tmp_path / "annotated.jsonl"
    run = subprocess.run([sys.executable, "-m", "dreamgym", "collect", "--env", "browser", "--env-arg",
                          f"start_url={site_url}", "--policy", "noisy", "--episodes", "3", "--split", "train",
                          "--out", str(data)], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    trajs = list(read_trajectories(data))
    assert len(trajs) == 3 and all(t.meta["env"] == "browser" for t in trajs)
    assert "searchbox" in trajs[0].transitions[0].state and trajs[0].transitions[0].action.startswith("type[")
    assert all(x.info["url"].startswith(site_url) for t in trajs for x in t.transitions)  # the explainer's ground truth
    assert trajs[0].meta["site"] == SITE.to_dict()
    run = subprocess.run([sys.executable, "-m", "dreamgym", "annotate", "--data", str(data), "--annotator", "rule",
                          "--out", str(annotated)], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    steps = [x for t in read_trajectories(annotated) for x in t.transitions]
    assert all(x.info["reasoning"] for x in steps)
    assert any(x.info["reasoning"].startswith("search [") for x in steps)  # the shop's traces, naming bids


# The repo's configs/browser-shop-tiny.yaml, shrunk to ~90 s on one core: 6 noisy-oracle episodes through Chromium,
# one RL iteration of 2 tasks x 2 rollouts per RL stage, 2-episode evaluations, one Chromium per pool. The SFT
# warm start gets 40 steps (8 examples) so that the micro policy answers option numbers and some of its actions
# are valid: those reach M_exp in the dream (an all-invalid policy would get the grammar's answer only).
MICRO = {
    "env_kwargs": {"num_products": 100, "num_tasks_per_split": 20, "max_steps": 6, "timeout_s": 10,
                   "offer_instruction": True},
    "offline_episodes": 6, "eval_episodes": 2, "eval_num_envs": 1, "heldout_episodes": 2, "max_steps": 6,
    "exp_sft": {"epochs": 3, "learning_rate": 3e-3, "batch_size": 16, "max_length": 1024, "num_threads": 1},
    "sft": {"epochs": 40, "learning_rate": 1e-2, "batch_size": 16, "num_threads": 1},
    "rl": {"iterations": 1, "tasks_per_iter": 2, "group_size": 2, "eval_every": 0, "num_threads": 1,
           "max_steps": 4, "minibatch_size": 32, "eval_episodes": 2},
    "dream_iterations": 1,
}


AX_LINE = re.compile(r"^\[\d+\] [a-z]+: ", re.MULTILINE)  # an accessibility-tree line: [bid] role: name


def processes_marked(mark: str) -> list[str]:
    """Live processes whose environment carries ``mark`` (a subprocess's descendants, even orphaned ones)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            if proc.environ().get("DREAMGYM_TEST_MARK") == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid} {proc.name()}")
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
def test_micro_pipeline_through_the_browser(tmp_path: Path) -> None:
    """`dreamgym demo --config configs/browser-shop-tiny.yaml`, micro-sized: collect through Chromium, annotate,
    M_exp on browser states, the dream on them, GRPO-real / S2R and every evaluation in the real browser."""
    needs_browser()
    from dreamgym.envs.web.env import parse_browser_action
    from dreamgym.types import read_trajectories

    config = yaml.safe_load(Path("configs/browser-shop-tiny.yaml").read_text())
    assert config["env"] == "browser" and config["annotator"] == "rule"
    (tmp_path / "browser.yaml").write_text(yaml.safe_dump({**config, **MICRO}))
    out = tmp_path / "demo"
    mark = f"dreamgym-browser-demo-{uuid.uuid4().hex}"  # inherited by every process the demo starts
    r = subprocess.run([sys.executable, "-m", "dreamgym", "demo", "--config", str(tmp_path / "browser.yaml"),
                        "--out", str(out)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "DREAMGYM_TEST_MARK": mark})
    assert r.returncode == 0, r.stderr[-3000:]
    assert processes_marked(mark) == []  # no chromium (or driver) of the demo outlived it, orphaned or not
    for name in ("collect", "annotate", "train_exp", "fidelity", "sft", "grpo_real", "dreamgym", "s2r"):
        assert (out / "stages" / f"{name}.json").exists(), name
    # the offline data came through the browser: accessibility-tree states and browser actions
    trajs = list(read_trajectories(out / "offline.jsonl"))
    assert len(trajs) == 6 and all(t.meta["env"] == "browser" for t in trajs)
    first = trajs[0].transitions[0]
    assert AX_LINE.search(first.state) and "] searchbox: " in first.state and first.action.startswith("type[")
    actions = [x.action for t in trajs for x in t.transitions]
    assert all(a.startswith(("type[", "click[", "select[", "go_back", "stop[")) for a in actions)
    annotation = json.loads((out / "stages" / "annotate.json").read_text())
    assert annotation["annotator"] == "rule" and annotation["written"] == 6 and annotation["fallbacks"] == 0
    assert all(x.info["reasoning"] for t in read_trajectories(out / "offline_annotated.jsonl") for x in t.transitions)
    # M_exp was trained on the browser states, and the dream asked it for steps
    exp = json.loads((out / "stages" / "train_exp.json").read_text())
    assert (out / "experience_model").is_dir() and exp["steps"] > 0 and exp["transitions"] == len(actions)
    dream = json.loads((out / "dreamgym" / "summary.json").read_text())
    assert dream["real_transitions"] == 0 and dream["synthetic_transitions"] > 0
    calls = dream["experience_model"]
    assert calls["ok"] + calls["failed"] > 0, calls  # some valid actions reached M_exp (not only the grammar)
    dreamt = [x for line in (out / "dreamgym" / "rollouts").glob("*.jsonl") for t in read_trajectories(line)
              for x in t.transitions]
    assert dreamt and all(AX_LINE.search(x.state) for x in dreamt)  # dreamt from browser states
    assert any(parse_browser_action(x.action) for x in dreamt)  # the policy played browser actions in the dream
    # every row was evaluated in the real browser on the test split
    table = json.loads((out / "table.json").read_text())
    assert table["env"] == "browser"
    rows = {row["method"]: row for row in table["rows"]}
    assert list(rows) == ["SFT", "GRPO (real)", "DreamGym", "DreamGym-S2R"]
    assert rows["DreamGym"]["real_transitions"] == 0
    assert rows["GRPO (real)"]["real_transitions"] > 0 and rows["DreamGym-S2R"]["real_transitions"] > 0
    sft = json.loads((out / "stages" / "sft.json").read_text())
    assert sft["episodes"] == 2
    for run in ("grpo_real", "dreamgym", "s2r"):
        assert json.loads((out / run / "summary.json").read_text())["eval_episodes"] == 2, run
    assert table["wm2real"]["episodes"] > 0  # the dream's rollouts replayed in the real browser
    assert "8/8 DreamGym-S2R: continue in the real browser" in r.stderr
    assert (out / "report.html").exists()


def test_a_page_without_an_accessibility_tree_is_a_state_and_clicks_on_it_are_invalid() -> None:
    needs_browser()
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse

    import dreamgym
    from dreamgym.envs.server import BackgroundServer
    from dreamgym.envs.web.axtree import EMPTY_PAGE

    app = FastAPI()
    app.get("/", response_class=HTMLResponse)(lambda: "<html><head></head><body></body></html>")
    server = BackgroundServer(app)
    env = dreamgym.make("browser", start_url=server.start(), timeout_s=5)
    try:
        obs, info = env.reset(seed=0)
        assert obs.strip().endswith(EMPTY_PAGE) and info["admissible_actions"] == []
        obs2, reward, terminated, truncated, info = env.step("click[3]")
        assert (obs2, reward, terminated, info["invalid_action"]) == (obs, 0.0, False, True)
        assert "no element with bid" in info["last_action_error"]
    finally:
        env.close()
        server.stop()


# --------------------------------------------------------------------------------- the rule explainer

class _Scripted:
    """A browser policy playing fixed actions; ``{box}`` / ``{text}`` stand for the search page's box / first text."""

    name = "scripted"

    def __init__(self, actions: list[str]) -> None:
        self.actions = actions

    def reset(self, env: object, task: object) -> None:
        self.t = 0

    def act(self, obs: str, info: dict) -> str:
        from dreamgym.envs.base import parse_elements

        lines = parse_elements(obs)
        box = next((e.id for e in lines if e.type == "searchbox"), "?")
        text = next((e.id for e in lines if e.type == "text"), "?")
        self.t += 1
        return self.actions[self.t - 1].format(box=box, text=text)


def test_rule_explainer_traces_browser_steps_from_the_shop(env) -> None:
    from dreamgym.collect import iter_episodes, run_episode
    from dreamgym.envs.base import parse_elements
    from dreamgym.envs.web.explain import explain_trajectory
    from dreamgym.experience.annotate import rule_explainer

    assert rule_explainer("browser") is explain_trajectory
    for traj in iter_episodes(env, env.scripted_policy("oracle"), 3, split="test", seed=3):
        e = explain_trajectory(traj)
        assert not e.issues and len(e.reasoning) == traj.num_steps and e.task_tutorial is not None
        buy, last = e.reasoning[-1], traj.transitions[-1]
        assert buy.startswith("buy [") and buy.endswith(f"={last.reward:.2f} -> done") and last.reward == 1.0
        asin = traj.task.goal["asin"]
        open_at = next(t for t, r in enumerate(e.reasoning) if r.startswith("open ["))
        bid = re.match(r"open \[(\d+)\] (\S+)", e.reasoning[open_at]).groups()  # type: ignore[union-attr]
        line = next(x for x in parse_elements(traj.transitions[open_at].state) if x.id == bid[0])
        assert bid[1] == asin and line.text.startswith(asin)  # the product the clicked link names
    # invalid actions, a click on text, a search, go_back and stop
    policy = _Scripted(["click[99999]", "type[{text}][x]", "click[{text}]", "type[{box}][bed sheets]", "go_back",
                        "stop[nothing]"])
    traj = run_episode(env, policy, env.tasks("test")[1], seed=0, split="test")  # type: ignore[arg-type]
    e = explain_trajectory(traj)
    assert not e.issues, e.issues
    assert e.reasoning[0] == "invalid: click[99999]: no element [99999] on this page -> state unchanged, reward 0"
    assert e.reasoning[1].endswith("is not a text field -> state unchanged, reward 0")
    assert e.reasoning[2].endswith("-> nothing to click, page unchanged")
    assert re.fullmatch(r'search \[\d+\] "bed sheets" -> results page 1, 1-\d+ of \d+', e.reasoning[3])
    assert e.reasoning[4:] == ["go_back -> search page", 'stop "nothing" -> episode ends, nothing bought, reward 0']
    # a tampered record is counted, not explained from a guess; the next step's URL puts the replay back in step
    oracle = next(iter_episodes(env, env.scripted_policy("oracle"), 1, split="test", seed=5))
    at = next(t for t, x in enumerate(oracle.transitions) if explain_trajectory(oracle).reasoning[t].startswith("open"))
    other = next(x.id for x in parse_elements(oracle.transitions[at].state)
                 if x.type == "link" and x.text.startswith("B0") and f"click[{x.id}]" != oracle.transitions[at].action)
    tampered = oracle.model_copy(deep=True)
    tampered.transitions[at].action = f"click[{other}]"
    e = explain_trajectory(tampered)
    assert e.issues == {"replay_mismatch": 1, "text_only_steps": 1, "url_resync": 1}
    assert e.reasoning[at] == f"click[{other}] -> Shop — Item, reward 0.00"
    assert e.reasoning[at + 1:] == explain_trajectory(oracle).reasoning[at + 1:]  # back in step
    tampered = oracle.model_copy(deep=True)
    tampered.transitions[-1].reward = 0.5
    e = explain_trajectory(tampered)
    assert e.issues == {"replay_mismatch": 1, "reward_mismatch": 1, "text_only_steps": 1}
    assert e.reasoning[-1] == tampered.transitions[-1].action + " -> Shop — Thank you, reward 0.50"
    # a record without URLs (collected before they were kept) is replayed from its pages alone
    old = oracle.model_copy(deep=True)
    for x in old.transitions:
        x.info.pop("url")
    assert explain_trajectory(old).reasoning == explain_trajectory(oracle).reasoning
    # another site: plain traces, counted
    foreign = oracle.model_copy(update={"meta": {"env": "browser", "env_kwargs": {"start_url": "http://example.com"}}})
    e = explain_trajectory(foreign)
    assert e.issues == {"unknown_site": 1, "text_only_steps": oracle.num_steps} and len(e.reasoning) == oracle.num_steps
