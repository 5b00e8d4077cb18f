"""Recall: the dream answers the steps the offline data recorded as the real env did, and generates the rest."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.experience.dream import DreamEnv, DreamEnvPool, InitialStates
from dreamgym.experience.model import ExperienceConfig, ExperienceModel
from dreamgym.experience.protocol import ExperienceQuery, format_target, terminated
from dreamgym.experience.recall import Recall
from dreamgym.llm.base import Completion, Prompt, SamplingParams
from dreamgym.types import Task, Trajectory, Transition

DREAMT_PAGE = "[1] text: a page the model wrote"


class PageLLM:
    """A stand-in for a trained M_exp (its output is scripted, not the code under test): every answer is one page."""

    tokenizer = None

    def __init__(self) -> None:
        self.actions: list[str] = []

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        out = []
        for p in prompts:
            text = p if isinstance(p, str) else p[-1]["content"]
            action = re.search(r"ACTION: (.*)$", text, re.MULTILINE)
            assert action is not None
            self.actions.append(action.group(1).strip())
            target = format_target(DREAMT_PAGE, 0.0, False, False, "because", ExperienceConfig().protocol_config())
            out.append(Completion(text=target, token_ids=[], finish_reason="stop"))
        return out

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
        raise NotImplementedError


@pytest.fixture(scope="module")
def shop():
    return make("shop", num_products=100)


@pytest.fixture(scope="module")
def offline(shop) -> list[Trajectory]:
    return list(iter_episodes(shop, shop.scripted_policy("noisy", seed=0), 20, split="train", seed=0))


def _traj(traj_id: str, steps: list[tuple[str, str, str, float, bool]], success: bool = False,
          source: str = "real", truncated_last: bool = False) -> Trajectory:
    transitions = [Transition(state=s, action=a, next_state=n, reward=r, done=d,
                              info={"truncated": True} if truncated_last and i == len(steps) - 1 else {})
                   for i, (s, a, n, r, d) in enumerate(steps)]
    task = Task(task_id="t0", env="toy", instruction="make tea")
    return Trajectory(traj_id=traj_id, task=task, transitions=transitions, success=success, source=source)  # type: ignore[arg-type]


def test_recall_holds_each_recorded_step_as_the_targets_read_it(offline: list[Trajectory]) -> None:
    recall = Recall.of(offline)
    steps = [(traj, t) for traj in offline for t in range(len(traj.transitions))]
    assert 0 < len(recall) <= len(steps)
    for traj, t in steps:
        x = traj.transitions[t]
        got = recall(ExperienceQuery(traj.task.instruction, [], [], x.state, x.action))
        assert got is not None and got.recalled and got.reasoning is None and got.failure is None
        assert got.done == terminated(x)
        if sum(1 for tr, s in steps if (tr.task.instruction, tr.transitions[s].state, tr.transitions[s].action)
               == (traj.task.instruction, x.state, x.action)) == 1:  # recorded once: exactly that outcome
            last = t == len(traj.transitions) - 1
            assert (got.next_state, got.reward, got.success) == (x.next_state, x.reward, traj.success and last and x.done)
    x = offline[0].transitions[0]
    assert recall(ExperienceQuery("another task", [], [], x.state, x.action)) is None  # the task is part of the key
    assert recall(ExperienceQuery(offline[0].task.instruction, [], [], x.state, "click[no such thing]")) is None


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


def test_the_dream_recalls_recorded_steps_and_generates_the_rest(shop, offline: list[Trajectory]) -> None:
    llm = PageLLM()
    model = ExperienceModel(llm, ExperienceConfig(protocol={"k": 0}), recall=Recall.of(offline))
    tasks = {"train": [t.task for t in offline]}
    pool = DreamEnvPool(lambda: DreamEnv(model, tasks, InitialStates.from_trajectories(offline), grammar=shop), 2)
    first = [offline[0].transitions[0], offline[1].transitions[0]]
    pool.reset_batch([0, 1], [offline[0].task, offline[1].task], [0, 1], "train")
    unrecorded = "search[a query the data never made]"
    results = pool.step_batch([0, 1], [first[0].action, unrecorded])
    assert llm.actions == [unrecorded]  # only the step the data lacks reached the model
    expected = model.recall(ExperienceQuery(offline[0].task.instruction, [], [], first[0].state, first[0].action))
    assert expected is not None and results[0].obs == expected.next_state and results[1].obs == DREAMT_PAGE
    steps = [env.transitions[0] for env in pool.envs]
    assert steps[0].info.get("recalled") and not steps[1].info.get("recalled")
    assert model.stats_dict()["recalled"] == 1 and model.stats.total == 1  # parse stats count generated steps only
    pool.close()


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
