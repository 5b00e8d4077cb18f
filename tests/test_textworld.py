"""TextWorld env (dreamgym[textworld]): generated tw-cooking games behind the dreamgym contract."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

pytest.importorskip("textworld", reason="the textworld extra is not installed: pip install 'dreamgym[textworld]'")

from dreamgym.collect import evaluate_scripted, run_episode
from dreamgym.envs import make
from dreamgym.envs.checker import check_env
from dreamgym.envs.textworld.env import TextWorldEnv
from dreamgym.envs.textworld.explain import (
    explain_trajectory,
    meal_outcome,
    recipe_ingredients,
    trace_premise,
)
from dreamgym.envs.textworld.games import GameSpec
from dreamgym.envs.textworld.state import clean_text, inventory_items, shown_commands
from dreamgym.experience.annotate import apply_annotation
from dreamgym.experience.protocol import ProtocolConfig
from dreamgym.experience.train import check_premises, exp_pairs
from dreamgym.types import DataError, ExperiencePrediction, Task


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tw-games")


@pytest.fixture(scope="module")
def env(cache_dir: Path) -> Iterator[TextWorldEnv]:
    env = make("textworld", num_train_games=3, num_test_games=2, cache_dir=str(cache_dir))
    assert isinstance(env, TextWorldEnv)
    yield env
    env.close()


def test_contract(env: TextWorldEnv) -> None:
    check_env(env, episodes=2)


def test_splits_are_disjoint_generated_games_cached_once(env: TextWorldEnv, cache_dir: Path) -> None:
    train, test = env.tasks("train"), env.tasks("test")
    assert len(train) == 3 and len(test) == 2
    assert {t.goal["seed"] for t in train}.isdisjoint({t.goal["seed"] for t in test})
    games = sorted(cache_dir.rglob("*.z8"))
    assert len(games) == 5 and not list(cache_dir.rglob(".gen-*"))  # no half-written games left
    mtimes = [g.stat().st_mtime_ns for g in games]
    again = TextWorldEnv(num_train_games=3, num_test_games=2, cache_dir=str(cache_dir))
    assert again.tasks("train") == train  # same tasks, read from the cache...
    assert [g.stat().st_mtime_ns for g in games] == mtimes  # ...without regenerating
    assert GameSpec.create("tw-cooking", None, 0).path(cache_dir) in games
    assert "ingredients:" in train[0].instruction


COOKING = "tw-cooking-af35ddab13"  # the default settings' key: task ids are f"{COOKING}-s{seed}"


def test_val_split_disjoint_and_train_test_as_before(env: TextWorldEnv, cache_dir: Path) -> None:
    train, test = env.tasks("train"), env.tasks("test")
    # the ids and first instruction the code gave before val existed (commit 0338b17)
    assert [t.task_id for t in train] == [f"{COOKING}-s{i}" for i in range(3)]
    assert [t.task_id for t in test] == [f"{COOKING}-s100000", f"{COOKING}-s100001"]
    assert train[0].instruction.endswith("(ingredients: flour)")
    assert test[0].instruction.endswith("(ingredients: red tuna (fried, sliced))")
    with_val = TextWorldEnv(num_train_games=3, num_test_games=2, num_val_games=1, cache_dir=str(cache_dir))
    val = with_val.tasks("val")
    assert [t.task_id for t in val] == [f"{COOKING}-s200000"] and val[0].goal["seed"] == 200_000
    assert with_val.tasks("train") == train and with_val.tasks("test") == test
    splits = {"train": train, "val": val, "test": test}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert {t.task_id for t in splits[a]}.isdisjoint({t.task_id for t in splits[b]}), (a, b)
        assert {t.goal["seed"] for t in splits[a]}.isdisjoint({t.goal["seed"] for t in splits[b]}), (a, b)
    again = TextWorldEnv(num_train_games=3, num_test_games=2, num_val_games=1, cache_dir=str(cache_dir))
    assert again.tasks("val") == val  # deterministic (and read from the cache)
    obs, info = with_val.reset(seed=0, options={"split": "val"})
    assert info["task"] == val[0] and info["admissible_actions"] and obs
    with_val.close()


def test_val_seeds_never_overlap_train_or_test() -> None:
    assert TextWorldEnv(num_train_games=3).seed_offset["val"] == 200_000
    crowded = TextWorldEnv(num_train_games=3, test_seed_offset=150_000, num_test_games=60_000)
    assert crowded.seed_offset["val"] == 210_000  # the default moves past test's seeds rather than overlap them
    assert TextWorldEnv(num_train_games=3, val_seed_offset=50).seed_offset["val"] == 50
    with pytest.raises(ValueError, match="overlap the train seeds"):
        TextWorldEnv(num_train_games=10, val_seed_offset=5)
    with pytest.raises(ValueError, match="overlap the test seeds"):
        TextWorldEnv(num_train_games=10, num_val_games=5, val_seed_offset=99_998)


def test_oracle_replays_task_exactly_and_succeeds(env: TextWorldEnv) -> None:
    task = env.tasks("test")[0]
    first = run_episode(env, env.scripted_policy("oracle"), task)
    second = run_episode(env, env.scripted_policy("oracle"), Task.model_validate(task.model_dump()))
    assert first.success and first.total_reward == 1.0
    assert [x.state for x in first.transitions] == [x.state for x in second.transitions]
    assert first.transitions[-1].done and all(x.reward == 0.0 for x in first.transitions[:-1])


def test_ingredient_takes_are_the_decision_steps_behaviour_cloning_repeats(env: TextWorldEnv) -> None:
    """TextWorld's ``EnvSpec.decision_step`` marks the oracle's choice of what to take (the recipe's ingredients
    among the other things lying about) and nothing else, so ``bc_decision_repeat`` repeats exactly those steps."""
    from dreamgym.agent.policy import PolicyConfig
    from dreamgym.baselines.sft import bc_examples
    from dreamgym.envs import spec

    decision = spec("textworld").load("decision_step")
    # the module's 3 train games: in one the oracle takes a chicken wing from a fridge that also holds a chicken leg
    trajs = [run_episode(env, env.scripted_policy("oracle"), task) for task in env.tasks("train")]
    marked = {t.task.task_id: [x for x in t.transitions if decision(x.state, x.action, x.info["admissible_actions"])]
              for t in trajs}
    assert sum(map(len, marked.values())) >= 1
    for t in trajs:  # every marked step takes one of the recipe's ingredients
        ingredients = t.task.instruction.rpartition("ingredients:")[2]
        assert all(x.action.startswith("take ") and x.action.split(" from ")[0][5:] in ingredients
                   for x in marked[t.task.task_id])
    assert not decision("", "open fridge", ["open fridge", "take milk from fridge", "take egg from fridge"])
    assert not decision("", "take milk from fridge", ["open fridge", "take milk from fridge"])  # nothing to choose
    cfg = PolicyConfig(action_format="index")
    once, thrice = bc_examples(trajs, cfg), bc_examples(trajs, cfg, decision_repeat=3)
    assert len(thrice) == len(once) + 2 * sum(map(len, marked.values()))


def test_val_metric_counts_ingredients_taken_not_positions(env: TextWorldEnv) -> None:
    """benchmarks/textworld_policy_val.py's skill metric: the oracle's first choice is an ingredient (1.0, above the
    random pick's baseline); the same episodes with that choice replaced by a thing not in the recipe score 0."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "textworld_policy_val.py"
    module_spec = importlib.util.spec_from_file_location("textworld_policy_val", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    trajs = [run_episode(env, env.scripted_policy("oracle"), task) for task in env.tasks("train")]
    oracle = module.first_choice(trajs)
    assert oracle["episodes_with_a_choice"] >= 1 and oracle["took_ingredient"] == 1.0
    assert 0 < oracle["random_pick_baseline"] < 1
    wrong = []
    for t in trajs:
        ingredients = t.task.instruction.rpartition("ingredients:")[2]
        steps = []
        for x in t.transitions:
            takes = [a for a in x.info["admissible_actions"] if a.startswith("take ")]
            if x.action in takes and len(takes) >= 2:
                other = next(a for a in takes if not module._is_ingredient(a, ingredients))
                x = x.model_copy(update={"action": other})
            steps.append(x)
        wrong.append(t.model_copy(update={"transitions": steps}))
    assert module.first_choice(wrong) == {**oracle, "took_ingredient": 0.0}


def test_refusal_metric_counts_a_policy_that_repeats_a_refused_prepare(cache_dir: Path) -> None:
    """benchmarks/textworld_policy_val.py's ``refusals``: the hasty policy's refused prepares are answered by the
    oracle with another command (never repeated; every episode won); the same episode with its first refusal
    repeated until the step limit, as the greedy SFT policy plays, counts every repeat and ends in a ``loop``."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "textworld_policy_val.py"
    module_spec = importlib.util.spec_from_file_location("textworld_policy_val", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    env = make("textworld", **TWO_INGREDIENTS, cache_dir=str(cache_dir / "probe"))
    policy = env.scripted_policy("hasty", seed=0, noise=0.0, early=1.0, swap=0.0)
    trajs = [run_episode(env, policy, task=task, seed=0) for task in env.tasks("train")]
    hasty = module.refusals(env, trajs)
    assert hasty["prepare_meal_no_effect"] == hasty["no_effect"] >= 1 and hasty["no_effect_followed"] >= 1
    assert hasty["repeated"] == 0 and hasty["repeat_rate"] == 0.0
    assert hasty["endings"] == {"won": len(trajs), "lost": 0, "loop": 0, "unfinished": 0}
    traj = trajs[0]
    first = next(i for i, x in enumerate(traj.transitions) if x.action == "prepare meal" and x.info.get("detour"))
    refused = traj.transitions[first]
    again = [refused.model_copy(update={"state": refused.next_state, "info": {}}) for _ in range(3)]
    again[-1] = again[-1].model_copy(update={"done": True, "info": {"truncated": True}})
    looped = traj.model_copy(update={"transitions": [*traj.transitions[:first + 1], *again], "success": False})
    loop = module.refusals(env, [looped])
    assert loop["repeated"] == loop["no_effect_followed"] == loop["no_effect"] == 3 and loop["repeat_rate"] == 1.0
    assert loop["endings"] == {"won": 0, "lost": 0, "loop": 1, "unfinished": 0}
    cut = looped.model_copy(update={"transitions": [*traj.transitions[:first + 1], again[-1]]})  # one repeat only
    assert module.refusals(env, [cut])["endings"]["unfinished"] == 1
    env.close()


def test_noisy_and_random_policies(env: TextWorldEnv) -> None:
    noisy = evaluate_scripted(env, env.scripted_policy("noisy", seed=1, noise=0.3), episodes=3, split="train")
    assert noisy.success_rate > 0 and noisy.invalid_action_rate == 0.0
    rand = evaluate_scripted(env, env.scripted_policy("random", seed=1), episodes=2, split="train")
    assert rand.invalid_action_rate == 0.0
    with pytest.raises(ValueError, match="noise"):
        env.scripted_policy("noisy", noise=2.0)


TWO_INGREDIENTS = {"settings": {"go": 1, "recipe": 2, "take": 2}, "num_train_games": 1, "num_test_games": 1,
                   "num_val_games": 2}  # the games of the prepare probes' test (one cache dir: compiled once)


def offered(state: str, action: str) -> bool:
    """Whether the page lists ``action`` among its commands."""
    return any(line.endswith(f"] command: {action}") for line in state.splitlines())


def test_hasty_policy_prepares_too_soon_and_the_game_refuses(cache_dir: Path) -> None:
    """TextWorld's ``hasty`` behaviour (extra data for M_exp): on two-ingredient games, preparing before every
    ingredient is carried, and after another item is taken in place of the last one, is refused by the real game;
    the oracle then recovers, and the hasty steps are detours (behaviour cloning never learns them)."""
    env = make("textworld", **TWO_INGREDIENTS, cache_dir=str(cache_dir / "probe"))
    tasks = env.tasks("train") + env.tasks("val")

    def prepares(policy_kwargs: dict[str, float]) -> list[tuple[bool, bool, bool]]:
        """(the episode's last prepare, refused, a detour) of each ``prepare meal``."""
        policy = env.scripted_policy("hasty", seed=0, noise=0.0, **policy_kwargs)
        out = []
        for task in tasks:
            traj = run_episode(env, policy, task=task, seed=0)
            assert traj.success  # it recovers
            feedback = [x.next_state.lower() for x in traj.transitions if x.action == "prepare meal"]
            detours = [bool(x.info.get("detour")) for x in traj.transitions if x.action == "prepare meal"]
            out += [(ok, "still miss something" in f, d) for ok, f, d in
                    zip([False] * (len(feedback) - 1) + [True], feedback, detours, strict=True)]
        return out

    for kwargs in ({"early": 0.0, "swap": 1.0}, {"early": 1.0, "swap": 0.0}):
        found = prepares(kwargs)
        # each game: refused hasty prepares (detours), then the oracle's own, which works
        assert any(not last for last, _, _ in found), kwargs
        assert all(refused == (not last) == detour for last, refused, detour in found), kwargs
    # the recipe traces (annotator_options {recipe: true}) say, from the instruction and what is carried, what the
    # game then decides: a refused prepare misses an ingredient, the made meal misses none, the swapped item is not
    # needed; by default the traces hold no recipe
    policy = env.scripted_policy("hasty", seed=0, noise=0.0, early=0.0, swap=1.0)
    recipe_trajs, plain_trajs = [], []
    for task in tasks:
        traj = run_episode(env, policy, task=task, seed=0)
        needed = recipe_ingredients(task.instruction)
        assert len(needed) == 2 and all(n in task.instruction and "(" not in n for n in needed)
        traces = explain_trajectory(traj, recipe=True).reasoning
        assert not any("recipe:" in t for t in explain_trajectory(traj).reasoning)
        recipe_trajs.append(apply_annotation(traj, traces, "rule"))
        plain_trajs.append(apply_annotation(traj, explain_trajectory(traj).reasoning, "rule"))
        for x, trace in zip(traj.transitions, traces, strict=True):
            # the trace's start that the query alone decides (computed_premises): up to what the step changes
            premise = trace_premise(task.instruction, x.state, x.action)
            if premise is not None:
                assert trace.startswith(premise + "; "), (premise, trace)
            assert (premise is not None) == ("recipe:" in trace and offered(x.state, x.action))
            if x.action == "prepare meal":
                refused = "still miss something" in x.next_state.lower()
                assert ("; missing " in trace) == refused and ("none missing" in trace) == (not refused), trace
                # the real game makes the meal exactly when none is missing (dream_signal.py counts dreamt meals
                # that break this)
                assert meal_outcome(x.state, x.action, x.next_state, needed) == (not refused, not refused)
                made_anyway = x.state + "\n[i9] carrying: a meal"
                assert meal_outcome(x.state, x.action, made_anyway, needed) == (not refused, True)
            elif x.action.startswith("take "):
                scored = "score has just gone up" in x.next_state.lower()
                assert trace.count(" not needed;") == (not scored) and trace.count(" needed;") == 1, trace
            else:
                assert "recipe:" not in trace and meal_outcome(x.state, x.action, x.next_state, needed) is None
    # M_exp's training refuses premises its traces do not start with (annotated without the recipe)
    cfg = ProtocolConfig(k=0, computed_premises=True)
    premised = check_premises(exp_pairs(recipe_trajs, cfg), cfg, "textworld")
    assert premised == sum(x.action == "prepare meal" or x.action.startswith("take ")
                           for t in recipe_trajs for x in t.transitions if offered(x.state, x.action)) > 0
    with pytest.raises(DataError, match=f"of {premised} targets do not start with textworld's computed premise"):
        check_premises(exp_pairs(plain_trajs, cfg), cfg, "textworld")
    assert check_premises(exp_pairs(plain_trajs, ProtocolConfig(k=0)), ProtocolConfig(k=0), "textworld") == 0
    assert trace_premise("Eat the meal.", recipe_trajs[0].transitions[0].state, "prepare meal") is None  # no recipe
    calm = prepares({"early": 0.0, "swap": 0.0})  # the oracle alone: one prepare a game, accepted
    assert len(calm) == len(tasks) and not any(refused for _, refused, _ in calm)
    with pytest.raises(ValueError, match="swap"):
        env.scripted_policy("hasty", swap=1.5)
    env.close()


def test_a_prepare_the_game_refuses_is_a_step_without_effect_in_the_game_and_in_the_dream(cache_dir: Path) -> None:
    """``info["no_effect"]``: the real game's refused ``prepare meal`` changes nothing but the feedback line, and
    is flagged; every take, open and move the hasty policy makes changes the page and is not. The dream env reads
    a dreamt page with its real env's rule (``TextEnv.had_effect``)."""
    from dreamgym.experience.dream import DreamEnv

    env = make("textworld", **TWO_INGREDIENTS, cache_dir=str(cache_dir / "probe"))
    policy = env.scripted_policy("hasty", seed=0, noise=0.0, early=1.0, swap=0.0)
    steps = []
    for task in env.tasks("train") + env.tasks("val"):
        obs, info = env.reset(options={"task": task})
        policy.reset(env, task)
        done = False
        while not done:
            action = policy.act(obs, info)
            next_obs, _, terminated, truncated, info = env.step(action)
            steps.append((action, obs, next_obs, terminated, info["no_effect"]))
            obs, done = next_obs, terminated or truncated
    refused = [s for s in steps if s[0] == "prepare meal" and "still miss something" in s[2].lower()]
    assert refused and all(s[4] for s in refused)
    changing = [s for s in steps if s[0].startswith(("take ", "open ", "go "))]
    assert changing and not any(s[4] for s in changing)
    assert not any(s[4] for s in steps if s[3])  # a final step is never flagged
    _, state, next_state, _, _ = refused[0]
    assert env.had_effect(state, next_state) is False
    made = next_state + "\n[i9] carrying: a meal"  # a dreamt page where the meal was made anyway
    dream = DreamEnv(model=None, tasks={}, initial_state=lambda t: state, grammar=env)  # type: ignore[arg-type]
    assert dream.had_effect(state, next_state) is False and dream.had_effect(state, made) is True
    assert DreamEnv(model=None, tasks={}, initial_state=lambda t: state).had_effect(state, next_state) is None  # type: ignore[arg-type]
    env.close()


def test_checked_verdicts_refuse_a_dreamt_meal_that_the_recipe_trace_finds_short(cache_dir: Path) -> None:
    """TextWorld's trace checker (``checked_verdicts``): a ``prepare meal`` whose recipe trace leaves an ingredient
    missing gets the real game's page (the refusal, reward 0, not done), even when the model wrote a meal; the
    annotator's own traces and pages, refused or made, come back unchanged or unread; the game's own steps pass; a
    win other than eating a carried meal, or a meal carried after a step that cannot make one, is rejected."""
    from dreamgym.envs import spec
    from dreamgym.envs.textworld.recheck import (
        MEAL_FROM_NOWHERE,
        REFUSAL,
        UNREACHABLE_WIN,
        recheck_meal,
        recheck_step,
        refusal_page,
    )

    assert spec("textworld").load("trace_checker") is recheck_step
    env = make("textworld", **TWO_INGREDIENTS, cache_dir=str(cache_dir / "probe"))
    policy = env.scripted_policy("hasty", seed=0, noise=0.0, early=1.0, swap=1.0)
    refused = made = won = 0
    for task in env.tasks("train") + env.tasks("val"):
        traj = run_episode(env, policy, task=task, seed=0)
        for x, trace in zip(traj.transitions, explain_trajectory(traj, recipe=True).reasoning, strict=True):
            real = ExperiencePrediction(trace, x.next_state, x.reward, x.done, traj.success and x.done)
            checked = recheck_meal(x.state, x.action, real)
            assert recheck_step(x.state, x.action, real) == checked  # the real game's wins pass the checker too
            won += x.done and x.reward > 0
            if x.action != "prepare meal" or "none missing" in trace:
                assert checked is None, trace
                made += x.action == "prepare meal"
                continue
            refused += 1
            assert checked == real and x.next_state == refusal_page(x.state)  # the game's own page
            # the model copied the trace's opening, then wrote the meal, a reward and the end anyway
            score = trace.rpartition("; score ")[2].partition(";")[0]
            dreamt = ExperiencePrediction(trace.partition("; location")[0] + "; location Kitchen; carrying +a meal; "
                                          f"score {score} -> 1.00; reward 1", x.state + "\n[i9] carrying: a meal",
                                          1.0, True, True)
            assert recheck_meal(x.state, x.action, dreamt) == real
    assert refused and made and won == len(env.tasks("train") + env.tasks("val"))
    # a dreamt win anywhere else is rejected: an open answered with the game's ending, a meal eaten without one
    end = "location: Kitchen\n[f] feedback: You eat the meal. Not bad. *** The End ***"
    win = ExperiencePrediction("\"open oven\" listed: valid; location Kitchen; score 0.75 -> 1.00; done, reward 1.00",
                               end, 1.0, True, True)
    page = "location: Kitchen\n[i1] carrying: a red apple\n[c1] command: prepare meal"
    assert recheck_step(page, "open oven", win) == dataclasses.replace(win, failure=UNREACHABLE_WIN)
    assert recheck_step(page, "eat meal", win) == dataclasses.replace(win, failure=UNREACHABLE_WIN)
    assert recheck_step(page + "\n[i2] carrying: a meal", "eat meal", win) is None
    lost = dataclasses.replace(win, reward=0.0, success=False)
    assert recheck_step(page, "eat red apple", lost) is None  # a loss stands
    # a meal appears by prepare meal only (or is taken again): an open that adds one is rejected
    opened = ExperiencePrediction("\"open fridge\" listed: valid; carrying +a meal; reward 0",
                                  page + "\n[i2] carrying: a meal", 0.0, False, False)
    assert recheck_step(page, "open fridge", opened) == dataclasses.replace(opened, failure=MEAL_FROM_NOWHERE)
    assert recheck_step(page, "take meal", opened) is None and recheck_step(page, "take meal from table", opened) is None
    assert recheck_step(page, "take milk from fridge", opened) == dataclasses.replace(opened, failure=MEAL_FROM_NOWHERE)
    assert recheck_step(page + "\n[i2] carrying: a meal", "open fridge", opened) is None  # carried already
    assert refusal_page(page).splitlines()[:2] == ["location: Kitchen", f"[f] feedback: {REFUSAL}"]
    # the verdict follows the clauses the trace wrote: nothing missing there, nothing to check
    short = "\"prepare meal\" listed: valid; recipe: red apple, salt; carried: red apple"
    assert recheck_meal(page, "prepare meal", ExperiencePrediction(short + ", salt; none missing; reward 0",
                                                                    page, 0.0, False, False)) is None
    fixed = recheck_meal(page, "prepare meal", ExperiencePrediction(short + "; none missing; reward 1", page, 1.0,
                                                                    True, True))
    assert fixed is not None and fixed.reasoning == short + "; missing salt; location Kitchen; reward 0"
    assert recheck_meal(page, "prepare meal", ExperiencePrediction("it works; reward 1", page, 1.0, True, True)) is None
    # the model may write its own carried list again after the premise (seed 1's M_exp does): the premise's counts
    rewritten = recheck_meal(page, "prepare meal", ExperiencePrediction(
        short + "; missing salt; carried: red apple, salt; none missing; reward 1", page, 1.0, True, True))
    assert rewritten is not None and rewritten.reasoning == short + "; missing salt; location Kitchen; reward 0"
    env.close()


def test_open_effect_writes_the_page_the_game_shows_from_another_open_of_the_same_container(cache_dir: Path) -> None:
    """``TextWorldEnv.recorded_effect``: an ``open X`` of one episode, carried over to another episode's open of X in
    the same game from another state, gives the page the game showed there (its contents, its ``close``, an ``insert``
    per carried item) for most opens, and a different page only where the cap hid a command; other actions, and
    records that did not open X, say nothing."""
    env = make("textworld", **TWO_INGREDIENTS, cache_dir=str(cache_dir / "probe"))
    assert isinstance(env, TextWorldEnv)
    opens: dict[tuple[str, str], list[tuple[str, str]]] = {}
    try:
        for task in env.tasks("train"):
            for seed in range(6):
                traj = run_episode(env, env.scripted_policy("noisy", seed=seed, noise=0.5), task, seed=seed)
                for x in traj.transitions:
                    if x.action.startswith("open ") and not x.info.get("invalid_action"):
                        opens.setdefault((task.task_id, x.action), []).append((x.state, x.next_state))
        pairs = [(key[1], a, b) for key, rows in opens.items() for a in rows for b in rows if a[0] != b[0]]
        assert len(pairs) >= 4
        exact = 0
        for action, (state, real_next), (other_state, other_next) in pairs:
            page = env.recorded_effect(state, action, other_state, other_next)
            assert page is not None and page.splitlines()[1] == real_next.splitlines()[1]  # the game's feedback
            exact += page == real_next
        assert exact >= 0.75 * len(pairs), (exact, len(pairs))
        action, (state, _), (other_state, other_next) = pairs[0]
        assert env.recorded_effect(state, "take egg from fridge", other_state, other_next) is None
        assert env.recorded_effect(state, "open nothing", other_state, other_next) is None  # neither page offers it
        assert env.recorded_effect(state, action, other_next, other_next) is None  # a record that did not open it
    finally:
        env.close()
    # the dream's real env is asked; an env without a rule cannot serve recall_effects
    assert make("shop").recorded_effect("s", "click[x]", "s", "t") is None


def test_the_experience_model_resamples_a_win_the_checker_rejects_then_serves_the_failure_state() -> None:
    """With ``checked_verdicts`` a TextWorld M_exp that answers ``open oven`` with the game's ending is resampled,
    and, still winning after its resamples, serves the failure state (the page unchanged, reward 0, not done),
    counted; without the option the false win is served."""
    from dreamgym.experience.model import ExperienceConfig, ExperienceModel
    from dreamgym.experience.protocol import ExperienceQuery, format_target
    from dreamgym.llm.base import Completion, Prompt, SamplingParams

    page = "location: Kitchen\n[f] feedback: You open the fridge.\n[c1] command: open oven"
    end = "location: Kitchen\n[f] feedback: You eat the meal. Not bad. *** The End ***"

    class EndingLLM:
        tokenizer = None
        calls = 0

        def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
            self.calls += 1
            text = format_target(end, 1.0, True, True, "\"open oven\" listed: valid; done, reward 1.00",
                                 ExperienceConfig().protocol_config())
            return [Completion(text=text, token_ids=[], finish_reason="stop") for _ in prompts]

        def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
            raise NotImplementedError

    query = ExperienceQuery("Eat the meal (ingredients: red apple).", [], [], page, "open oven")
    plain = ExperienceModel(EndingLLM(), ExperienceConfig(env="textworld"))  # type: ignore[arg-type]
    assert plain.predict([query])[0].reward == 1.0
    llm = EndingLLM()
    checked = ExperienceModel(llm, ExperienceConfig(env="textworld", protocol={"checked_verdicts": True}))  # type: ignore[arg-type]
    served = checked.predict([query])[0]
    assert (served.next_state, served.reward, served.done, served.failure) == (page, 0.0, False, "unreachable_win")
    attempts = 1 + checked.cfg.max_resamples
    assert llm.calls == attempts and checked.stats_dict()["rejected_by_checker"] == attempts
    assert checked.stats_dict()["failures"] == {"unreachable_win": 1}


def test_invalid_command_keeps_state_and_abstract_state_grammar(env: TextWorldEnv) -> None:
    obs, info = env.reset(options={"task": env.tasks("train")[0]})
    assert obs.startswith("location: ") and "[f] feedback: " in obs and "$$" not in obs
    assert env.admissible_for_state(obs) == info["admissible_actions"]
    assert env.action_valid_for_state(obs, info["admissible_actions"][0]) is True
    assert env.action_valid_for_state(obs, "fly to the moon") is False
    obs2, reward, terminated, _, info2 = env.step("fly to the moon")
    assert (obs2, reward, terminated, info2["invalid_action"]) == (obs, 0.0, False, True)
    assert info2["admissible_actions"] == info["admissible_actions"]


def test_state_mapper_helpers() -> None:
    assert clean_text("-= Kitchen =-\nYou are   here.\n\n> 0/3", 100) == "You are here."
    assert clean_text("x" * 50, 10) == "x" * 9 + "…"
    assert inventory_items("You are carrying:\n  a milk\n  a knife\n") == ["a milk", "a knife"]
    assert inventory_items("You are carrying nothing.\n") == []
    assert inventory_items("You are carrying: some peanut oil, a knife and a cookbook.") == [
        "some peanut oil", "a knife", "a cookbook"]
    many = [f"examine thing{i}" for i in range(5)] + ["go north", "look", "take milk"]
    assert shown_commands(many, 3) == ["go north", "take milk", "examine thing0"]


def test_bad_settings_and_split(cache_dir: Path) -> None:
    env = TextWorldEnv(challenge="tw-nope", num_train_games=1, num_test_games=1, cache_dir=str(cache_dir))
    with pytest.raises(ValueError, match="unknown TextWorld challenge"):
        env.tasks("train")
    with pytest.raises(ValueError, match="unknown split"):
        env.tasks("valid")
    with pytest.raises(ValueError, match="overlaps"):
        TextWorldEnv(num_train_games=10, test_seed_offset=5)


def test_gymnasium_make_passes_gymnasiums_checker(cache_dir: Path) -> None:
    from conftest import gym_check

    gym_check("textworld", num_train_games=3, num_test_games=2, cache_dir=str(cache_dir))


def test_unnumbered_pages_keep_their_lines_so_copy_references_point_at_them(env: TextWorldEnv, cache_dir: Path) -> None:
    """numbered=False: the same games and commands, each command ``[c]``; an action that adds a command renumbers
    nothing, so the next state's copy-reference target is shorter than with positional ids, on the same steps."""
    from dreamgym.envs.textworld.state import commands_in_state
    from dreamgym.experience.protocol import ExperienceQuery, ProtocolConfig, step_target

    plain = make("textworld", num_train_games=3, num_test_games=2, cache_dir=str(cache_dir), numbered=False)
    refs = ProtocolConfig(k=0, reasoning=False, copy_refs=True)
    lengths, states = {}, {}
    for name, e in (("numbered", env), ("plain", plain)):
        traj = run_episode(e, e.scripted_policy("oracle", seed=0), e.tasks("train")[0])
        assert traj.success
        lengths[name] = sum(len(step_target(traj, t, None, refs, ExperienceQuery.at_step(traj, t)))
                            for t in range(len(traj.transitions)))
        states[name] = [x.state for x in traj.transitions]
    assert all("[c1]" not in s for s in states["plain"]) and any("\n[c] command: " in s for s in states["plain"])
    assert [commands_in_state(s) for s in states["plain"]] == [commands_in_state(s) for s in states["numbered"]]
    assert plain.admissible_for_state(states["plain"][0]) == env.admissible_for_state(states["numbered"][0])
    assert lengths["plain"] < 0.9 * lengths["numbered"]
    plain.close()


def test_prepare_probes_record_what_the_real_game_answers(cache_dir: Path) -> None:
    """benchmarks/prepare_probe.py: on two-ingredient games the real game refuses `prepare meal` before the oracle
    would prepare (early) and after another item is taken in place of the last ingredient (wrong: as many items
    carried as when ready), and prepares when the oracle does (ready); a non-TextWorld run is a one-line error."""
    import importlib.util
    import subprocess
    import sys
    from types import SimpleNamespace

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "prepare_probe.py"
    spec = importlib.util.spec_from_file_location("prepare_probe", script)
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    cfg = SimpleNamespace(env="textworld", max_steps=20, env_kwargs={**TWO_INGREDIENTS,
                                                                      "cache_dir": str(cache_dir / "probe")})
    found = probe.probes(cfg, 2)
    kinds = [(k, real) for _, k, real in found]
    assert kinds.count(("ready", "meal")) == 2 and ("early", "miss") in kinds and ("wrong", "miss") in kinds
    assert {real for _, real in kinds} == {"miss", "meal"}
    carried = {k: q.state.count("carrying: ") for q, k, _ in found}
    assert carried["wrong"] == carried["ready"] == 2 and carried["early"] == 1
    assert all(q.action == "prepare meal" and q.history for q, _, _ in found)
    assert probe.answer("[f] feedback: You still miss something.") == "miss" and probe.answer("location: x") == "other"
    run = cache_dir / "shop_run"
    (run / "experience_model").mkdir(parents=True)
    (run / "experience_model" / "experience.json").write_text("{}")
    (run / "demo_config.yaml").write_text("env: shop\n")
    bad = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "the probes are TextWorld's" in bad.stderr
