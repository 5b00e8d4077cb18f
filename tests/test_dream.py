"""The dream env: same contract as the real shop, batched model calls, the buffer co-evolving, fallbacks."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.envs.checker import check_env
from dreamgym.experience.dream import DreamEnv, DreamEnvPool, InitialStates
from dreamgym.experience.model import ExperienceConfig, ExperienceModel
from dreamgym.experience.protocol import ExperienceQuery, format_target, terminated
from dreamgym.experience.recall import Recall
from dreamgym.llm.base import Completion, Prompt, SamplingParams
from dreamgym.replay import HashingEncoder, ReplayBuffer
from dreamgym.types import Trajectory

ITEM_PAGE = "[1] text: B0TEST01 — Test Shirt, Cotton\n[2] text: Price: $10.00\n[3] button: Buy Now\n[4] button: Back to Search"


class ShopScriptLLM:
    """A stand-in for a trained M_exp (the model's *output* is what is scripted, not the code under test):
    answers in the protocol format, opening an item page on any click and ending with reward 1 on buy."""

    tokenizer = None

    def __init__(self, garbage_every: int = 0) -> None:
        self.calls: list[int] = []
        self.prompts: list[str] = []
        self.garbage_every = garbage_every
        self.n = 0

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        self.calls.append(len(prompts))
        out = []
        for p in prompts:
            text = p if isinstance(p, str) else p[-1]["content"]
            self.prompts.append(text)
            action = re.search(r"ACTION: (.*)$", text, re.MULTILINE)
            assert action is not None
            self.n += 1
            if self.garbage_every and self.n % self.garbage_every == 0:
                out.append(Completion(text="<think>the click opens", token_ids=[], finish_reason="length"))
                continue
            buy = action.group(1).strip().lower() == "click[buy now]"
            target = format_target("[1] text: Thank you for shopping!" if buy else ITEM_PAGE, 1.0 if buy else 0.0,
                                   buy, buy, "because", ExperienceConfig().protocol_config())
            out.append(Completion(text=target, token_ids=[], finish_reason="stop"))
        return out

    def generate_ids(self, prompt_ids: Sequence[list[int]], params: SamplingParams) -> list[Completion]:
        raise NotImplementedError


@pytest.fixture(scope="module")
def shop():
    return make("shop", num_products=100)


@pytest.fixture(scope="module")
def offline(shop):
    return list(iter_episodes(shop, shop.scripted_policy("noisy", seed=0), 20, split="train", seed=0))


def dream_env(shop, offline, llm, buffer=None, **cfg) -> DreamEnv:
    model = ExperienceModel(llm, ExperienceConfig(**cfg), buffer=buffer)
    tasks = {"train": shop.tasks("train")[:50], "test": shop.tasks("test")[:20]}
    return DreamEnv(model, tasks, InitialStates.from_trajectories(offline), grammar=shop)


def test_dream_env_honours_the_env_contract(shop, offline) -> None:
    env = dream_env(shop, offline, ShopScriptLLM())
    check_env(env, episodes=3)
    obs, info = env.reset(seed=0, options={"split": "test"})
    assert obs == offline[0].transitions[0].state  # the shop's search page
    assert info["admissible_actions"][0].startswith("search[")


def test_invalid_action_is_answered_by_the_grammar_without_a_model_call(shop, offline) -> None:
    llm = ShopScriptLLM()
    env = dream_env(shop, offline, llm)
    obs, _ = env.reset(seed=1)
    obs2, reward, term, _trunc, info = env.step("click[buy now]")  # not on the search page
    assert info["invalid_action"] and reward == 0.0 and obs2 == obs and not term
    assert llm.calls == []
    _, _, _, _, info = env.step("search[cotton shirt]")
    assert not info["invalid_action"] and llm.calls == [1]
    _, reward, term, _, info = env.step("click[buy now]")
    assert term and reward == 1.0 and info["success"]
    traj = env.trajectory()
    assert traj.source == "synthetic" and traj.success and [t.action for t in traj.transitions][-1] == "click[buy now]"


def test_dream_prompts_number_the_history_as_training_prompts_do(shop, offline) -> None:
    """Grammar-rejected actions are steps of the episode (the real env records them, so training prompts show
    them): the dream's history holds them too and numbers steps absolutely past the window, like
    ``ExperienceQuery.at_step`` on the trajectory the dream wrote."""
    from dreamgym.experience.protocol import ExperienceQuery, build_user_text

    llm = ShopScriptLLM()
    env = dream_env(shop, offline, llm, protocol={"k": 0, "history_window": 2})
    env.reset(seed=1)
    actions = ["click[buy now]", "search[cotton shirt]", "click[back to search]", "click[nope]",
               "click[back to search]", "click[buy now]"]
    for action in actions:
        env.step(action)
    traj = env.trajectory()
    valid = [t for t, x in enumerate(traj.transitions) if not x.info["invalid_action"]]
    assert valid == [1, 2, 4, 5] and len(llm.prompts) == 4
    protocol = env.model.protocol
    assert llm.prompts == [build_user_text(ExperienceQuery.at_step(traj, t), protocol) for t in valid]
    assert "#3 click[back to search]\n#4 click[nope]" in llm.prompts[2]


def test_pool_batches_one_model_call_per_step_and_feeds_the_buffer(shop, offline, tmp_path: Path) -> None:
    llm = ShopScriptLLM()
    buffer = ReplayBuffer.open(tmp_path / "buf", encoder=HashingEncoder())
    buffer.add_trajectories(offline)
    n_real = len(buffer)
    env_proto = dict(protocol={"k": 2})
    pool = DreamEnvPool(lambda: dream_env(shop, offline, llm, buffer, **env_proto), num_envs=4)
    pool.iteration = 3
    tasks = shop.tasks("train")[:4]
    pool.reset_batch(range(4), tasks, [0, 1, 2, 3], "train")
    pool.step_batch(range(4), ["search[cotton shirt]"] * 4)
    assert llm.calls == [4]  # one batched call for four episodes
    assert "SIMILAR:" in llm.prompts[0]  # neighbours retrieved from the buffer are in the prompt
    results = pool.step_batch(range(4), ["click[buy now]", "click[back to search]", "click[nope]", "click[buy now]"])
    assert llm.calls == [4, 3]  # the invalid click never reached the model
    assert [r.terminated for r in results] == [True, False, False, True]
    assert results[2].info["invalid_action"]
    assert len(pool.finished) == 2
    # Two 2-step synthetic episodes written back; they are identical, so exact-duplicate suppression keeps 2.
    assert len(buffer) == n_real + 2
    stats = buffer.stats()
    assert stats.by_source.get("synthetic") == 2 and stats.by_iteration.get(3) == 2


def test_malformed_outputs_are_resampled_then_counted_failures(shop, offline) -> None:
    llm = ShopScriptLLM(garbage_every=1)  # every output malformed
    env = dream_env(shop, offline, llm, max_resamples=2)
    obs, _ = env.reset(seed=0)
    obs2, reward, term, _, info = env.step("search[cotton shirt]")
    assert obs2 == obs and reward == 0.0 and not term and info["dream_failure"] == "truncated"
    assert llm.calls == [1, 1, 1]  # first try + 2 resamples
    stats = env.model.stats_dict()
    assert stats["failed"] == 1 and stats["resamples"] == 2 and stats["invalid_rate"] == 1.0


class RepeatingLLM(ShopScriptLLM):
    """Writes an item page that lists one element twice on its first ``repeats`` calls (the TextWorld dream's
    defect: the item just taken offered five times), then the clean page."""

    def __init__(self, repeats: int) -> None:
        super().__init__()
        self.repeats = repeats

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        out = super().generate(prompts, params)
        if len(self.calls) > self.repeats:
            return out
        page = ITEM_PAGE + "\n[5] button: Buy Now"
        return [Completion(text=format_target(page, 0.0, False, False, "because", ExperienceConfig().protocol_config()),
                           token_ids=[], finish_reason="stop") for _ in out]


def test_unique_elements_resamples_a_page_that_repeats_an_element(shop, offline) -> None:
    env = dream_env(shop, offline, RepeatingLLM(repeats=1), max_resamples=2)  # off (the default): served as written
    env.reset(seed=0)
    obs, *_ = env.step("search[cotton shirt]")
    assert obs.count("button: Buy Now") == 2
    llm = RepeatingLLM(repeats=1)
    env = dream_env(shop, offline, llm, max_resamples=2, unique_elements=True)
    env.reset(seed=0)
    obs, *_ = env.step("search[cotton shirt]")
    assert obs.count("button: Buy Now") == 1 and llm.calls == [1, 1] and env.model.stats_dict()["resamples"] == 1
    env = dream_env(shop, offline, RepeatingLLM(repeats=9), max_resamples=1, unique_elements=True)
    first, _ = env.reset(seed=0)
    obs, reward, term, _, info = env.step("search[cotton shirt]")  # never clean: the counted failure state
    assert obs == first and reward == 0.0 and not term and info["dream_failure"] == "repeated_element"
    assert env.model.stats_dict()["failed"] == 1


def test_untrained_hf_model_never_breaks_the_dream(shop, offline, tmp_path: Path) -> None:
    from dreamgym.llm.tiny import init_tiny_model
    from dreamgym.types import write_jsonl

    write_jsonl(tmp_path / "corpus.jsonl", offline)
    init_tiny_model("micro", [tmp_path / "corpus.jsonl"], tmp_path / "m", seed=0)
    model = ExperienceModel.load(tmp_path / "m", cfg=ExperienceConfig(max_new_tokens=24, max_resamples=1))
    env = DreamEnv(model, {"train": shop.tasks("train")[:5]}, InitialStates.from_trajectories(offline), grammar=shop)
    obs, info = env.reset(seed=0)
    for _ in range(3):
        obs, reward, _term, _trunc, info = env.step(info["admissible_actions"][0])
        assert isinstance(obs, str) and 0.0 <= reward <= 1.0
    assert model.stats.total == 3 and model.stats.failed + model.stats.ok == 3


def test_prompts_too_long_for_the_context_are_shortened_or_served_as_counted_failures(shop, offline,
                                                                                       tmp_path: Path) -> None:
    from dreamgym.experience.protocol import ExperienceQuery, Neighbour
    from dreamgym.llm.tiny import init_tiny_model
    from dreamgym.types import write_jsonl

    write_jsonl(tmp_path / "corpus.jsonl", offline)
    init_tiny_model("micro", [tmp_path / "corpus.jsonl"], tmp_path / "m", seed=0)
    model = ExperienceModel.load(tmp_path / "m", cfg=ExperienceConfig(max_new_tokens=16, max_resamples=0,
                                                                      protocol={"k": 2, "history_window": 3}))
    step = offline[0].transitions[1]
    neighbour = Neighbour(step.state, step.action, step.next_state, 0.0, False)
    query = ExperienceQuery(offline[0].task.instruction, [(step.state, step.action)] * 3, [neighbour] * 2,
                            step.state, step.action)
    full = len(model.llm.encode(model.prompt(query)))
    model.llm.max_length = full  # the full prompt plus 16 new tokens no longer fits; without neighbours it does
    assert model.fit_context(query, model.prompt(query)) is not None and model.shortened_prompts == 1
    [prediction] = model.predict([query])  # generation runs on the shortened prompt: no error
    assert model.stats.total == 1 and model.shortened_prompts == 2
    model.llm.max_length = 20  # nothing fits: a counted failure (the state unchanged, reward 0), not an exception
    [failed] = model.predict([query])
    assert failed.next_state == query.state.strip() and failed.failure == "truncated"
    assert failed.reward == 0.0 and model.stats.failed >= 1 and model.stats_dict()["shortened_prompts"] == 2


def test_the_dream_is_a_registered_env_that_the_agentgym_server_serves(shop, offline, tmp_path: Path) -> None:
    """make("dream", ...) like any env, so `dreamgym env serve dream` serves it over the AgentGym protocol
    (the way into AgentGym-RL); the server's sessions share one loaded M_exp and dream their steps."""
    import dreamgym
    from dreamgym.envs.agentgym import AgentGymEnv
    from dreamgym.envs.server import BackgroundServer, create_app
    from dreamgym.experience import dream as dream_module
    from dreamgym.llm.tiny import init_tiny_model
    from dreamgym.types import write_jsonl

    write_jsonl(tmp_path / "offline.jsonl", offline)
    init_tiny_model("micro", [tmp_path / "offline.jsonl"], tmp_path / "m", seed=0)
    kwargs = {"experience_model": str(tmp_path / "m"), "offline_data": str(tmp_path / "offline.jsonl"),
              "env": "shop", "env_kwargs": {"num_products": 100}, "max_new_tokens": 16, "max_steps": 3}
    env = dreamgym.make("dream", **kwargs)
    assert isinstance(env, DreamEnv) and env.tasks("test") == shop.tasks("test")
    obs, info = env.reset(seed=0, options={"split": "test"})
    assert obs in {t.transitions[0].state for t in offline}  # a real initial state
    loaded = len(dream_module._LOADED)
    with BackgroundServer(create_app("dream", kwargs, max_sessions=4)) as base:
        remote = AgentGymEnv(url=base, env_name="dream")
        obs, info = remote.reset(seed=0, options={"task": remote.tasks("test")[0]})
        obs, reward, terminated, truncated, info = remote.step(info["admissible_actions"][0])
        assert isinstance(obs, str) and 0.0 <= reward <= 1.0
        remote.close()
    assert len(dream_module._LOADED) == loaded  # the server's env reused the loaded model


def test_computed_premises_open_the_answer_and_the_model_writes_on(offline, tmp_path: Path) -> None:
    """With ``ProtocolConfig.computed_premises`` the env's premise (TextWorld: which recipe ingredients are carried,
    which missing) opens the answer: generation starts after its tokens, tokenized as SFT tokenizes a target, within
    the same ``max_new_tokens``, and the output is read with it; a step the env has no premise for is generated
    whole. Through a real (untrained) HF model and tokenizer."""
    from dreamgym.experience.protocol import ExperienceQuery, premise_text
    from dreamgym.llm.tiny import init_tiny_model
    from dreamgym.types import write_jsonl

    write_jsonl(tmp_path / "corpus.jsonl", offline)
    init_tiny_model("micro", [tmp_path / "corpus.jsonl"], tmp_path / "m", seed=0)
    state = ("location: Kitchen\n[f] feedback: You take the egg.\n[i1] carrying: a roasted egg\n"
             "[c1] command: go north\n[c2] command: prepare meal")
    task = "Make the recipe, then eat the meal (ingredients: egg (roasted), water)"
    meal, north = ExperienceQuery(task, [], [], state, "prepare meal"), ExperienceQuery(task, [], [], state, "go north")
    cfg = ExperienceConfig(env="textworld", max_new_tokens=100, max_resamples=0,
                           protocol={"k": 0, "computed_premises": True})
    model = ExperienceModel.load(tmp_path / "m", cfg=cfg)
    llm, asked = model.llm, []
    real_rows = llm.generate_rows  # type: ignore[attr-defined]

    def rows(ids: list[list[int]], params: list[SamplingParams]) -> list[Completion]:
        asked.extend(zip(ids, (p.max_new_tokens for p in params), strict=True))
        return list(real_rows(ids, params))

    llm.generate_rows = rows  # type: ignore[attr-defined]
    model.predict([meal, north])
    premise = '"prepare meal" listed: valid; recipe: egg, water; carried: egg; missing water'
    opening = llm.tokenizer(premise_text(premise, meal, model.protocol), add_special_tokens=False).input_ids
    assert opening[0:1] == llm.tokenizer("<think>", add_special_tokens=False).input_ids[0:1]
    prompt_ids = [llm.encode(model.prompt(q)) for q in (meal, north)]  # type: ignore[attr-defined]
    assert asked == [(prompt_ids[0] + opening, 100 - len(opening)), (prompt_ids[1], 100)]
    assert model.stats_dict()["premised"] == 1

    # what the model writes after the opening is read with it
    rest = ("; location Kitchen; score 0.25; reward 0</think>\n<state>\n" + state.replace("You take the egg.",
            "You still miss something.") + "\n</state>\n<reward>0.00</reward> <done>0</done> <success>0</success>")
    llm.generate_rows = lambda ids, params: [Completion(text=rest, token_ids=[], finish_reason="stop") for _ in ids]  # type: ignore[attr-defined]
    [pred] = model.predict([meal])
    assert pred.failure is None and pred.reasoning == premise + "; location Kitchen; score 0.25; reward 0"
    assert "You still miss something." in pred.next_state and model.premised == 2

    # a premise needs an env that computes one, and a local model to start the answer in
    with pytest.raises(ValueError, match="trace_premise"):
        ExperienceModel.load(tmp_path / "m", cfg=cfg.model_copy(update={"env": "shop"}))
    with pytest.raises(ValueError, match="local"):
        ExperienceModel(ShopScriptLLM(), cfg)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reasoning"):
        ExperienceConfig(protocol={"computed_premises": True, "reasoning": False}).protocol_config()


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


def test_the_dream_recalls_recorded_steps_and_generates_the_rest(shop, offline: list[Trajectory]) -> None:
    llm = ShopScriptLLM()
    model = ExperienceModel(llm, ExperienceConfig(protocol={"k": 0}), recall=Recall.of(offline))
    tasks = {"train": [t.task for t in offline]}
    pool = DreamEnvPool(lambda: DreamEnv(model, tasks, InitialStates.from_trajectories(offline), grammar=shop), 2)
    first = [offline[0].transitions[0], offline[1].transitions[0]]
    pool.reset_batch([0, 1], [offline[0].task, offline[1].task], [0, 1], "train")
    unrecorded = "search[a query the data never made]"
    results = pool.step_batch([0, 1], [first[0].action, unrecorded])
    assert llm.calls == [1] and f"ACTION: {unrecorded}" in llm.prompts[0]  # only the step the data lacks
    expected = model.recall(ExperienceQuery(offline[0].task.instruction, [], [], first[0].state, first[0].action))
    assert expected is not None and results[0].obs == expected.next_state and results[1].obs == ITEM_PAGE
    steps = [env.transitions[0] for env in pool.envs]
    assert steps[0].info.get("recalled") and not steps[1].info.get("recalled")
    assert model.stats_dict()["recalled"] == 1 and model.stats.total == 1  # parse stats count generated steps only
    pool.close()
