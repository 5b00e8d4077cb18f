"""Recall's table: the recorded outcome of each (task, state, action); the rollouts' recalled mark. (The dream's use of
it, on the shop: tests/test_dream.py.)"""

from __future__ import annotations

import pydantic
import pytest

from dreamgym.experience.protocol import ExperienceQuery
from dreamgym.experience.recall import Recall
from dreamgym.types import Task, Trajectory, Transition


def _traj(traj_id: str, steps: list[tuple[str, str, str, float, bool]], success: bool = False,
          source: str = "real", truncated_last: bool = False) -> Trajectory:
    transitions = [Transition(state=s, action=a, next_state=n, reward=r, done=d,
                              info={"truncated": True} if truncated_last and i == len(steps) - 1 else {})
                   for i, (s, a, n, r, d) in enumerate(steps)]
    task = Task(task_id="t0", env="toy", instruction="make tea")
    return Trajectory(traj_id=traj_id, task=task, transitions=transitions, success=success, source=source)  # type: ignore[arg-type]


def test_recall_keeps_the_most_frequent_outcome_and_only_real_endings() -> None:
    a = ("kitchen", "open kettle", "kettle open", 0.0, False)
    b = ("kitchen", "open kettle", "kettle open, it is empty", 0.0, False)
    end = ("kettle open", "drink tea", "you drink the tea", 1.0, True)
    recall = Recall.of([_traj("1", [b]), _traj("2", [a]), _traj("3", [a, end], success=True),
                        _traj("4", [b, end], source="synthetic"), _traj("5", [b], source="synthetic")])
    opened = recall(ExperienceQuery("make tea", [], [], "kitchen", "open kettle"))
    assert opened is not None and opened.next_state == "kettle open"  # 2 real against 1; synthetic ones not counted
    drunk = recall(ExperienceQuery("make tea", [], [], "kettle open", "drink tea"))
    assert drunk is not None and drunk.done and drunk.success and drunk.reward == 1.0
    tie = Recall.of([_traj("1", [b]), _traj("2", [a])])(ExperienceQuery("make tea", [], [], "kitchen", "open kettle"))
    assert tie is not None and tie.next_state == b[2]  # the first recorded among equals
    cut = Recall.of([_traj("1", [a, end], truncated_last=True)])(ExperienceQuery("make tea", [], [], "kettle open",
                                                                                  "drink tea"))
    assert cut is not None and not cut.done and not cut.success  # a step-limit cut is no ending, as in the targets


def test_an_effect_rule_carries_a_recorded_action_over_to_another_state_of_the_task() -> None:
    """With an env's ``recorded_effect`` a step the data took in the same task from another state is answered by the
    rule from the first non-final record (marked recalled, counted); an exact record still comes first; another task,
    an ending, a synthetic record or a rule that cannot say leaves the step to the model."""
    def effect(state: str, action: str, recorded_state: str, recorded_next: str) -> str | None:
        return None if "locked" in state else f"{state} + ({recorded_next} - {recorded_state})"

    a = ("kitchen", "open kettle", "kettle open, it holds water", 0.0, False)
    end = ("kettle open", "drink tea", "you drink the tea", 1.0, True)
    dreamt = ("kettle open", "drink tea", "you spill it", 0.0, False)
    recall = Recall.of([_traj("1", [a, end], success=True), _traj("2", [dreamt], source="synthetic")], effect)
    carried = recall(ExperienceQuery("make tea", [], [], "hall", "open kettle"))
    assert carried is not None and carried.recalled and not carried.done and carried.reasoning is None
    assert carried.next_state == "hall + (kettle open, it holds water - kitchen)" and recall.effects == 1
    exact = recall(ExperienceQuery("make tea", [], [], "kitchen", "open kettle"))
    assert exact is not None and exact.next_state == a[2] and recall.effects == 1  # the record itself
    assert recall(ExperienceQuery("make coffee", [], [], "hall", "open kettle")) is None  # another task
    assert recall(ExperienceQuery("make tea", [], [], "hall", "drink tea")) is None  # only an ending recorded
    assert recall(ExperienceQuery("make tea", [], [], "locked hall", "open kettle")) is None  # the rule cannot say
    assert Recall.of([_traj("1", [a])])(ExperienceQuery("make tea", [], [], "hall", "open kettle")) is None  # no rule
    from dreamgym.experience.dream import DreamConfig

    with pytest.raises(pydantic.ValidationError, match="set recall too"):
        DreamConfig(experience_model="m", offline_data=["d.jsonl"], recall_effects=True)
    assert DreamConfig(experience_model="m", offline_data=["d.jsonl"], recall=True, recall_effects=True).recall_effects


def test_written_rollouts_say_which_dreamt_steps_were_recalled() -> None:
    """The trainer writes its episodes (``rollouts/``) with the dream's flags, which dream_signal.py counts."""
    from dreamgym.rl.rollout import Episode, Turn

    def turn(info: dict[str, object]) -> Turn:
        return Turn(state="s", admissible=[], prompt_ids=[], response_ids=[], logprobs=None, text="a", action="a",
                    parsed=True, next_state="n", env_reward=0.0, reward=0.0, terminated=False, truncated=False,
                    info=info)

    episode = Episode(task=Task(task_id="t0", env="toy", instruction="make tea"), group_id=0, seed=0,
                      source="synthetic", turns=[turn({"recalled": True}), turn({"dream_failure": "bad_ref"}), turn({})])
    infos = [x.info for x in episode.to_trajectory().transitions]
    assert [i.get("recalled", False) for i in infos] == [True, False, False]
    assert [i.get("dream_failure") for i in infos] == [None, "bad_ref", None]
