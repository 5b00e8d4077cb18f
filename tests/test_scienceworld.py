"""ScienceWorld env (dreamgym[scienceworld] + Java): the simulator behind the dreamgym contract.

One JVM for the whole module (module-scoped fixture), closed at the end and checked gone.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

pytest.importorskip("scienceworld", reason="the scienceworld extra is not installed: pip install 'dreamgym[scienceworld]'")
if shutil.which("java") is None:
    pytest.skip("ScienceWorld needs Java (a JRE 11+ on PATH)", allow_module_level=True)

from dreamgym.collect import evaluate_scripted, run_episode
from dreamgym.envs import make
from dreamgym.envs.checker import check_env
from dreamgym.envs.scienceworld.env import ScienceWorldEnv
from dreamgym.envs.scienceworld.state import derived_actions, parse_inventory, parse_look, referent
from dreamgym.types import Task

TASKS = "find-living-thing,lifespan-longest-lived"


@pytest.fixture(scope="module")
def env() -> Iterator[ScienceWorldEnv]:
    env = make("scienceworld", task=TASKS, max_variations=3)
    assert isinstance(env, ScienceWorldEnv)
    java = env._java
    yield env
    env.close()
    assert java.poll() is not None, "the JVM outlived close()"


def test_contract_with_and_without_admissible(env: ScienceWorldEnv) -> None:
    check_env(env, episodes=2)
    env.admissible = False  # the fast path: the menu comes from the room text
    try:
        check_env(env, episodes=2)
    finally:
        env.admissible = True


def test_splits_by_variation_per_task_type(env: ScienceWorldEnv) -> None:
    train, test = env.tasks("train"), env.tasks("test")
    assert len(train) == len(test) == 6
    assert {t.goal["task_name"] for t in train} == set(TASKS.split(","))
    assert {t.task_id for t in train}.isdisjoint({t.task_id for t in test})
    assert all(t.instruction.startswith("Your task is") for t in train)


def test_val_split_is_scienceworlds_dev_variations(env: ScienceWorldEnv) -> None:
    train, val, test = env.tasks("train"), env.tasks("val"), env.tasks("test")
    # the ids the code gave before val existed (commit 0338b17): ScienceWorld's train and test variations
    assert [t.task_id for t in train[:3]] == [f"sw-find-living-thing-v{v}" for v in range(3)]
    assert [t.task_id for t in test[:3]] == [f"sw-find-living-thing-v{v}" for v in (225, 226, 227)]
    assert test[0].instruction.endswith("move it to the orange box in the living room.")
    assert [t.task_id for t in val[:3]] == [f"sw-find-living-thing-v{v}" for v in (150, 151, 152)]
    assert len(val) == 6 and env.tasks("dev") == val == env.tasks("val")  # deterministic; "dev" is val's other name
    splits = {"train": train, "val": val, "test": test}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert {t.task_id for t in splits[a]}.isdisjoint({t.task_id for t in splits[b]}), (a, b)
        keys = {(t.goal["task_name"], t.goal["variation"]) for t in splits[a]}
        assert keys.isdisjoint({(t.goal["task_name"], t.goal["variation"]) for t in splits[b]}), (a, b)
    obs, info = env.reset(seed=0, options={"split": "val"})
    assert info["task"] in val and obs
    with pytest.raises(ValueError, match="unknown split"):
        env.tasks("valid")


def test_oracle_replays_task_exactly_and_succeeds(env: ScienceWorldEnv) -> None:
    task = env.tasks("test")[0]
    first = run_episode(env, env.scripted_policy("oracle"), task)
    second = run_episode(env, env.scripted_policy("oracle"), Task.model_validate(task.model_dump()))
    assert first.success and first.total_reward == 1.0
    assert [x.state for x in first.transitions] == [x.state for x in second.transitions]
    assert all(x.reward == 0.0 for x in first.transitions[:-1])


def test_noisy_recovers_and_random_is_weak(env: ScienceWorldEnv) -> None:
    noisy = evaluate_scripted(env, env.scripted_policy("noisy", seed=3, noise=0.3), episodes=4, split="train")
    assert noisy.success_rate >= 0.75 and noisy.invalid_action_rate == 0.0
    rand = evaluate_scripted(env, env.scripted_policy("random", seed=3), episodes=4, split="train")
    assert rand.success_rate <= noisy.success_rate


def test_invalid_action_keeps_state(env: ScienceWorldEnv) -> None:
    obs, info = env.reset(options={"task": env.tasks("train")[0]})
    assert obs.startswith("location: hallway") and "[a1] action: " in obs
    assert env.admissible_for_state(obs) == info["admissible_actions"]
    assert env.action_valid_for_state(obs, info["admissible_actions"][0]) is True
    assert env.action_valid_for_state(obs, "teleport to mars") is None  # the parser may accept more
    obs2, reward, terminated, _, info2 = env.step("teleport to mars")
    assert (obs2, reward, terminated, info2["invalid_action"]) == (obs, 0.0, False, True)
    obs3, *_ = env.step("open door to kitchen")
    assert "door to kitchen (open)" in obs3


def test_state_mapper_helpers() -> None:
    look = ("This room is called the kitchen. In it, you see: \n\tthe agent\n\ta substance called air\n"
            "\ta fire pit (containing nothing)\n\ta bathtub, which is turned off.\nYou also see:\n"
            "\tA door to the hallway (that is open)\n\tA door to the outside (that is closed)\n")
    room = parse_look(look)
    assert room.location == "kitchen"
    assert room.objects == ("a bathtub, which is turned off.", "a fire pit (containing nothing)")
    assert room.doors == (("hallway", True), ("outside", False))
    assert [referent(o) for o in room.objects] == ["bathtub", "fire pit"]
    inventory = parse_inventory("In your inventory, you see:\n\tan orange\n")
    actions = derived_actions(room, inventory)
    assert actions[:2] == ["go to hallway", "open door to outside"]
    assert "focus on fire pit" in actions and "focus on orange" in actions


def test_unknown_task_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown task types"):
        ScienceWorldEnv(task="boil,fly-to-mars")


def test_gymnasium_make_passes_gymnasiums_checker() -> None:
    from conftest import gym_check

    gym_check("scienceworld", task=TASKS, max_variations=3)
