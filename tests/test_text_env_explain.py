"""Rule explainers of TextWorld and ScienceWorld (dreamgym.envs.explain_diff): one compact trace per real
transition, with the state diff from the record and the score from a replay; a record the replay cannot
reproduce is counted, never explained with a wrong score."""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any

import pytest

from dreamgym.collect import run_episode
from dreamgym.envs import make
from dreamgym.envs.base import ScriptedPolicy, TextEnv
from dreamgym.envs.explain_diff import ParsedState, element_diff, state_diff
from dreamgym.experience.annotate import REASONING_KEY, RuleAnnotator
from dreamgym.types import Task, Trajectory

needs_textworld = pytest.mark.skipif(importlib.util.find_spec("textworld") is None,
                                     reason="the textworld extra is not installed: pip install 'dreamgym[textworld]'")
needs_scienceworld = pytest.mark.skipif(
    importlib.util.find_spec("scienceworld") is None or shutil.which("java") is None,
    reason="needs the scienceworld extra (pip install 'dreamgym[scienceworld]') and Java on PATH")


class FirstThen:
    """Plays ``first`` once, then the wrapped policy (to put an invalid step into a real trajectory)."""

    name = "first-then"

    def __init__(self, first: str, then: ScriptedPolicy) -> None:
        self.first, self.then, self.done_first = first, then, False

    def reset(self, env: TextEnv, task: Task | None) -> None:
        self.then.reset(env, task)
        self.done_first = False

    def act(self, obs: str, info: dict[str, Any]) -> str:
        if not self.done_first:
            self.done_first = True
            return self.first
        return self.then.act(obs, info)


def test_state_diff_of_abstract_states() -> None:
    before = "location: Kitchen\n[f] feedback: hi\n[c1] command: open fridge\n[c2] command: go east"
    after = "location: Kitchen\n[f] feedback: opened\n[i1] carrying: a milk\n[c1] command: close fridge\n[c2] command: go east"
    assert ParsedState.parse(after).elements["carrying"] == ["a milk"]
    assert state_diff(before, after, ("carrying", "command"), frozenset({"command"})) == [
        "location Kitchen", "carrying +a milk", "command +close fridge -open fridge"]
    moved = after.replace("location: Kitchen", "location: Pantry")
    assert state_diff(before, moved, ("carrying", "command"), frozenset({"command"})) == [
        "location Kitchen -> Pantry", "new room: 2 command", "carrying +a milk"]
    assert element_diff(["a"], ["b", "c", "d", "e"], max_items=2) == "+b +c (+2 more) -a"


@needs_textworld
def test_textworld_traces_follow_the_real_game() -> None:
    env = make("textworld", num_train_games=2, num_test_games=1)
    task = env.tasks("train")[0]
    traj = run_episode(env, FirstThen("fly to the moon", env.scripted_policy("oracle")), task, seed=0)
    env.close()
    assert traj.success and traj.transitions[0].info["invalid_action"]
    [annotated] = (annotator := RuleAnnotator()).annotate([traj])
    traces = [x.info[REASONING_KEY] for x in annotated.transitions]
    assert annotator.stats.counts == {} and annotated.meta["annotator"] == "rule:textworld"
    assert traces[0] == '"fly to the moon" not listed: invalid -> state unchanged, reward 0'
    assert all(t.startswith(f'"{x.action}" listed: valid; location ') for t, x in zip(traces[1:], traj.transitions[1:], strict=True))
    assert "score" in traces[1] and traces[-1].endswith("-> 1.00; done, reward 1.00")
    scored = [t for t in traces if " -> " in t.split("score ")[-1]]  # each point of the recipe is a score step
    assert len(scored) >= 2 and all(len(t) < 400 for t in traces)
    assert any("new room: " in t for t in traces)  # the cooking games need a move to another room


@needs_textworld
def test_a_record_the_replay_cannot_reproduce_is_counted() -> None:
    env = make("textworld", num_train_games=2, num_test_games=1)
    traj = run_episode(env, env.scripted_policy("oracle"), env.tasks("train")[1], seed=0)
    env.close()
    [clean] = RuleAnnotator().annotate([traj])
    t = next(i for i, x in enumerate(clean.transitions) if i > 0 and "new room" not in x.info[REASONING_KEY])
    tampered = traj.model_copy(deep=True)
    tampered.transitions[t].next_state += "\n[i9] carrying: a dance"  # not what the game showed
    [annotated] = (annotator := RuleAnnotator()).annotate([tampered])
    traces = [x.info[REASONING_KEY] for x in annotated.transitions]
    assert annotator.stats.counts["replay_mismatch"] == 1
    assert all("score" in tr for tr in traces[:t]) and all("score" not in tr for tr in traces[t:])
    assert "carrying +a dance" in traces[t]  # the diff still reads the record


@needs_scienceworld
def test_scienceworld_traces_follow_the_real_task() -> None:
    env = make("scienceworld", task="find-living-thing", admissible=False, max_variations=1)
    try:
        traj: Trajectory = run_episode(env, env.scripted_policy("oracle"), env.tasks("train")[0], seed=0)
    finally:
        env.close()
    assert traj.success
    [annotated] = (annotator := RuleAnnotator()).annotate([traj])
    traces = [x.info[REASONING_KEY] for x in annotated.transitions]
    assert annotator.stats.counts == {} and len(traces) == traj.num_steps
    assert any("door +door to" in t and "(open)" in t for t in traces)  # opening a door, seen in the diff
    assert any("new room: " in t for t in traces)
    assert traces[-1].endswith("-> 1.00; done, reward 1.00")
