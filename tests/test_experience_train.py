"""SFT of the experience model: masking, neighbours never from the own trajectory, memorisation, eval-exp."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from dreamgym.cli import app
from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.experience.annotate import RuleAnnotator
from dreamgym.experience.model import ExperienceConfig, ExperienceModel
from dreamgym.experience.protocol import ExperienceQuery, ProtocolConfig, action_target, step_target
from dreamgym.experience.train import (
    exp_examples,
    exp_pairs,
    exp_queries,
    fresh_tiny_model,
    mix,
    step_kinds,
    train_experience_model,
)
from dreamgym.llm.tiny import tiny_shape
from dreamgym.replay import HashingEncoder, ReplayBuffer
from dreamgym.sft import (
    IGNORE_INDEX,
    MaskedCollator,
    SFTConfig,
    SFTExample,
    encode_prompt,
    target_logits_loss,
    tokenize_example,
)
from dreamgym.types import DataError, Task, Trajectory, Transition, write_jsonl

COMPACT = ProtocolConfig(k=0, history_window=0, system_prompt="")


@pytest.fixture(scope="module")
def shop():
    return make("shop", num_products=100)


@pytest.fixture(scope="module")
def annotated(shop) -> list[Trajectory]:
    trajs = list(iter_episodes(shop, shop.scripted_policy("noisy", seed=0, noise=0.3), 6, split="train", seed=0))
    return RuleAnnotator().annotate(trajs)


def one_step(traj: Trajectory, t: int) -> Trajectory:
    """Step ``t`` of ``traj`` as a one-step trajectory (done only if the step ended the episode)."""
    return traj.model_copy(update={"transitions": [traj.transitions[t]], "traj_id": f"{traj.traj_id}-{t}",
                                   "success": traj.success and t == len(traj.transitions) - 1})


def test_examples_need_reasoning_and_name_the_first_unannotated_trajectory(shop) -> None:
    raw = list(iter_episodes(shop, shop.scripted_policy("oracle"), 2, split="train", seed=0))
    with pytest.raises(DataError, match=raw[0].traj_id):
        exp_examples(raw, COMPACT)
    plain = exp_examples(raw, ProtocolConfig(k=0, reasoning=False))
    assert len(plain) == sum(len(t.transitions) for t in raw) and "<think>" not in plain[0].target


def test_one_example_per_transition_with_the_protocol_target(annotated) -> None:
    examples = exp_examples(annotated, COMPACT, chat=False)
    steps = [(traj, t) for traj in annotated for t in range(len(traj.transitions))]
    assert len(examples) == len(steps)
    for ex, (traj, t) in zip(examples, steps, strict=True):
        assert ex.target == step_target(traj, t, traj.transitions[t].info["reasoning"], COMPACT)
        now = traj.transitions[t]
        target = action_target(now.state, now.action)  # clicks name an element of the state; searches do not
        assert target is not None or now.action.startswith("search[")
        end = f"ACTION: {now.action}" + (f"\nTARGET: {target}" if target else "")
        assert isinstance(ex.prompt, str) and ex.prompt.rstrip().endswith(end)


def test_loss_is_on_target_tokens_only(annotated) -> None:
    examples = exp_examples(annotated[:1], COMPACT)
    model, tokenizer = fresh_tiny_model("micro", annotated, examples, 512, seed=0)
    ex = examples[-1]
    row = tokenize_example(tokenizer, ex, max_length=1024)
    assert row is not None
    n_prompt = len(encode_prompt(tokenizer, ex.prompt))
    labels = torch.tensor(row["labels"])
    assert (labels[:n_prompt] == IGNORE_INDEX).all() and (labels[n_prompt:] != IGNORE_INDEX).all()
    assert tokenizer.decode(row["input_ids"][n_prompt:], skip_special_tokens=True) == ex.target
    ids = torch.tensor([row["input_ids"]])
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels[None])
    # By hand: position i predicts token i+1; only target tokens count.
    logits = out.logits[0, n_prompt - 1 : -1]
    by_hand = F.cross_entropy(logits, ids[0, n_prompt:])
    assert torch.allclose(out.loss, by_hand, atol=1e-5)


def test_training_loss_projects_only_target_positions_and_equals_the_full_forwards(annotated) -> None:
    examples = exp_examples(annotated[:2], COMPACT)
    model, tokenizer = fresh_tiny_model("micro", annotated, examples, 512, seed=0)
    batch = MaskedCollator(tokenizer.pad_token_id)([tokenize_example(tokenizer, ex, 1024) for ex in examples[:3]])
    assert (batch["attention_mask"] == 0).any()  # rows of different lengths: padding is in play
    full = model(**batch)
    ours = target_logits_loss(model, batch)
    assert ours is not None and torch.allclose(ours, full.loss, atol=1e-5)
    n_target = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    summed = target_logits_loss(model, batch, num_items=2 * n_target)  # the Trainer's accumulated-batch count
    assert summed is not None and torch.allclose(summed, full.loss / 2, atol=1e-5)
    # the gradients match too, so training follows the same path
    ours.backward()
    g_ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(**batch).loss.backward()
    assert all(torch.allclose(a, p.grad, atol=1e-5) for a, p in zip(g_ours, model.parameters(), strict=True))


def test_protocol_tags_and_identifiers_tokenize_for_copying(annotated) -> None:
    _, tokenizer = fresh_tiny_model("micro", annotated, exp_examples(annotated[:1], COMPACT), 512, seed=0)
    for tag in ("<state>", "</state>", "<reward>", "</reward>", "<done>", "<success>", "<think>"):
        assert len(tokenizer(tag, add_special_tokens=False).input_ids) == 1, tag
    # A product id is spelled out in both cases (the click is lower case), digits one by one.
    assert tokenizer.tokenize("B0QH9VSU") == list("B0QH9VSU")
    assert tokenizer.tokenize("click[b0qh9vsu]")[-9:] == [*"b0qh9vsu", "]"]
    assert tokenizer.tokenize("$729.72")[-6:] == list("729.72")


def test_neighbours_never_come_from_the_own_trajectory(tmp_path: Path) -> None:
    # Each trajectory's text names it, so its own steps are its most similar ones: exclusion is what keeps them out.
    trajs = []
    for i in range(5):
        steps = [Transition(state=f"[1] text: shelf T{i} aisle {t}", action=f"click[T{i} item {t}]",
                            next_state=f"[1] text: shelf T{i} aisle {t + 1}", reward=0.0, done=False,
                            info={"reasoning": f"walk T{i}"}) for t in range(3)]
        trajs.append(Trajectory(traj_id=f"T{i}", task=Task(task_id=f"task{i}", instruction=f"find T{i}", env="toy"),
                                transitions=steps))
    buffer = ReplayBuffer.open(tmp_path / "buf", encoder=HashingEncoder())
    buffer.add_trajectories(trajs)
    cfg = ProtocolConfig(k=2, neighbour_states=True, system_prompt="")
    examples = exp_examples(trajs, cfg, buffer, chat=False)
    assert len(examples) == 15
    for ex, (traj, _) in zip(examples, [(tr, t) for tr in trajs for t in range(3)], strict=True):
        assert isinstance(ex.prompt, str)
        similar = ex.prompt.split("SIMILAR:")[1].split("STATE:")[0]
        assert similar.count("→ click[") == 2  # k neighbours were found ...
        named = set(re.findall(r"T\d", similar))
        assert traj.traj_id not in named and named  # ... and none of them is from the step's own trajectory
    # Without the exclusion the own trajectory's steps are the nearest: the check above is not vacuous.
    own = buffer.retrieve(trajs[0].transitions[0].state, trajs[0].transitions[0].action, k=2)
    assert {h.traj_id for h in own} == {"T0"}


def test_an_example_never_retrieves_its_own_transition(tmp_path: Path) -> None:
    # Every episode starts with the same step (same page, action and outcome) and then goes its own way. The
    # buffer keeps the repeated step once, under T0: excluding the own trajectory does not keep it out.
    first = Transition(state="[1] text: shelf start", action="click[open]", next_state="[1] text: shelf open",
                       reward=0.0, done=False, info={"reasoning": "open it"})
    trajs = []
    for i in range(4):
        steps = [first, *(Transition(state=f"[1] text: shelf T{i} aisle {t}", action=f"click[T{i} item {t}]",
                                     next_state=f"[1] text: shelf T{i} aisle {t + 1}", reward=0.0, done=False,
                                     info={"reasoning": f"walk T{i}"}) for t in range(2))]
        trajs.append(Trajectory(traj_id=f"T{i}", task=Task(task_id=f"task{i}", instruction=f"find T{i}", env="toy"),
                                transitions=steps))
    buffer = ReplayBuffer.open(tmp_path / "buf", encoder=HashingEncoder())
    assert buffer.add_trajectories(trajs) == 1 + 4 * 2
    own = buffer.retrieve(first.state, first.action, k=1, env="toy", exclude_traj="T1")
    assert own[0].traj_id == "T0" and own[0].transition == first  # without the key: T1's step 0 sees its target
    cfg = ProtocolConfig(k=1, neighbour_states=True, system_prompt="")
    queries = list(exp_queries(trajs, cfg, buffer))
    assert len(queries) == 12 and all(len(q.retrieved) == 1 for _, _, q in queries)
    for traj, t, query in queries:
        x = traj.transitions[t]
        for n in query.retrieved:
            assert (n.state, n.action, n.next_state, n.reward, n.done) != (x.state, x.action, x.next_state, x.reward,
                                                                            x.done), (traj.traj_id, t)
    # The examples built from them carry the same neighbours.
    examples = exp_examples(trajs, cfg, buffer, chat=False)
    assert isinstance(examples[3].prompt, str) and "shelf open" not in examples[3].prompt.split("SIMILAR:")[1].split(
        "STATE:")[0]


def test_exact_neighbours_show_another_trajectorys_copy_of_the_step_marked_and_never_the_own(tmp_path: Path) -> None:
    """With ``exact_neighbours`` a step that another trajectory also recorded (the same search of the same task, as
    the dream finds it for a real task) is shown as that trajectory's, headed as the same step; a step only its own
    trajectory recorded is still never retrieved."""
    from dreamgym.experience.protocol import SAME_STEP

    first = Transition(state="[1] searchbox", action="search[red mug]", next_state="[1] link: red mug | $3",
                       reward=0.0, done=False, info={"reasoning": "search"})

    def episode(i: int, task: str) -> Trajectory:
        walk = [Transition(state=f"[1] text: aisle T{i} {t}", action=f"click[T{i} item {t}]",
                           next_state=f"[1] text: aisle T{i} {t + 1}", reward=0.0, done=False,
                           info={"reasoning": "walk"}) for t in range(2)]
        return Trajectory(traj_id=f"T{i}", task=Task(task_id=task, instruction=f"buy a {task}", env="toy"),
                          transitions=[first, *walk])

    # T0 and T1 play the same task and start alike; T2 (another task) starts alike too; T3's start is its own.
    trajs = [episode(0, "red mug"), episode(1, "red mug"), episode(2, "blue mug"), episode(3, "green mug")]
    trajs[3] = trajs[3].model_copy(update={"transitions": [
        first.model_copy(update={"action": "search[green mug]"}), *trajs[3].transitions[1:]]})
    buffer = ReplayBuffer.open(tmp_path / "buf", encoder=HashingEncoder())
    buffer.add_trajectories(trajs)  # the shared first step is stored once, under T0
    plain = ProtocolConfig(k=1, neighbour_states=True, system_prompt="")
    exact = plain.model_copy(update={"exact_neighbours": True})
    for cfg in (plain, exact):
        seen = {(traj.traj_id, t): q.retrieved[0] for traj, t, q in exp_queries(trajs, cfg, buffer)}
        for (traj_id, t), n in seen.items():
            x = next(tr for tr in trajs if tr.traj_id == traj_id).transitions[t]
            own = (n.state, n.action, n.next_state) == (x.state, x.action, x.next_state)
            # the own transition is shown only as a copy another trajectory holds, and only with the option on
            assert not own or (cfg.exact_neighbours and t == 0 and traj_id != "T3"), (cfg, traj_id, t)
        if cfg.exact_neighbours:  # T0 sees the copy stored under its own id: T1 and T2 recorded it too
            assert all(seen[f"T{i}", 0].next_state == first.next_state for i in range(3))
    examples = {traj.traj_id: ex for traj, ex in zip(trajs, exp_examples(trajs, exact, buffer, chat=False)[::3],
                                                     strict=True)}
    assert f"(1) {SAME_STEP}" in examples["T1"].prompt  # same task, state and action
    assert SAME_STEP not in examples["T2"].prompt  # the same step, but another task's: its outcome may differ
    assert SAME_STEP not in examples["T3"].prompt
    assert SAME_STEP not in exp_examples(trajs, plain, buffer, chat=False)[3].prompt
    # The dream serves the same prompt: a retrieved record carries its task, and the header follows from it.
    from dreamgym.experience.model import neighbours_of
    from dreamgym.experience.protocol import build_user_text

    served = neighbours_of(buffer.retrieve(first.state, first.action, k=1, env="toy"))
    query = ExperienceQuery("buy a red mug", [], served, first.state, first.action)
    assert served[0].instruction == "buy a red mug" and f"(1) {SAME_STEP}" in build_user_text(query, exact)
    assert SAME_STEP not in build_user_text(dataclasses.replace(query, instruction="buy a blue mug"), exact)
    assert "same task, state and action" in exact.model_copy(update={"system_prompt": None}).system_text()


def test_same_action_neighbours_show_the_page_the_action_opened_elsewhere_in_training_and_in_the_dream(
    tmp_path: Path,
) -> None:
    """With ``same_action_neighbours`` a step's neighbour is another trajectory's step that took the same action (the
    same product clicked from another results page), headed "same action"; without it, φ's nearest step (the same
    page's other click) is shown."""
    from dreamgym.experience.protocol import SAME_ACTION, build_user_text

    def step(page: str, item: str) -> Transition:
        return Transition(state=f"[1] text: results for {page}\n[2] link: {item}\n[3] link: other {page}",
                          action=f"click[{item}]", next_state=f"[1] text: item page of {item}", reward=0.0, done=False,
                          info={"reasoning": "open"})

    def episode(i: int, page: str, item: str) -> Trajectory:
        return Trajectory(traj_id=f"T{i}", task=Task(task_id=f"t{i}", instruction=f"buy {item}", env="toy"),
                          transitions=[step(page, item)])

    # T0 and T1 click the same mug from different pages; T2 clicks another item from T0's page.
    trajs = [episode(0, "mugs", "red mug"), episode(1, "cups and more", "red mug"), episode(2, "mugs", "blue mug")]
    buffer = ReplayBuffer.open(tmp_path / "buf", encoder=HashingEncoder())
    buffer.add_trajectories(trajs)
    plain = ProtocolConfig(k=1, neighbour_states=True, system_prompt="")
    same = plain.model_copy(update={"same_action_neighbours": True})
    shown = {cfg.same_action_neighbours: {tr.traj_id: q.retrieved[0] for tr, _, q in exp_queries(trajs, cfg, buffer)}
             for cfg in (plain, same)}
    assert shown[False]["T0"].next_state == "[1] text: item page of blue mug"  # the same page's other click
    assert shown[True]["T0"].next_state == "[1] text: item page of red mug"  # T1's click of the same mug
    assert shown[True]["T2"].action != "click[blue mug]"  # nobody else took T2's action: the nearest step
    prompts = {tr.traj_id: ex.prompt for tr, ex in zip(trajs, exp_examples(trajs, same, buffer, chat=False), strict=True)}
    assert f"(1) {SAME_ACTION}" in prompts["T0"] and SAME_ACTION not in prompts["T2"]
    assert SAME_ACTION not in exp_examples(trajs, plain, buffer, chat=False)[0].prompt
    # The dream's retrieval (ExperienceModel.with_neighbours) follows the model's protocol.
    query = ExperienceQuery("buy red mug", [], [], step("plates", "red mug").state, "click[red mug]")
    model = ExperienceModel(object(), ExperienceConfig.from_protocol(same), buffer=buffer)  # type: ignore[arg-type]
    served = model.with_neighbours([query])[0]
    assert served.retrieved[0].next_state == "[1] text: item page of red mug"
    assert f"(1) {SAME_ACTION}" in build_user_text(served, same)


def test_task_neighbours_show_what_the_action_revealed_in_the_same_task_as_new_lines(tmp_path: Path) -> None:
    """With ``task_neighbours`` a step's neighbour is another episode of its task that took its action (the same
    game's fridge opened from another state), headed "same task and action", in training and in the dream; with
    ``neighbour_changes`` it shows only the lines its next state added, and copy references read those lines."""
    from dreamgym.experience.protocol import SAME_TASK_ACTION, added_lines, build_user_text, parse_output

    def page(carrying: str, *commands: str) -> str:
        return "\n".join(["location: Kitchen", f"[i1] carrying: {carrying}",
                          *(f"[c{i}] command: {c}" for i, c in enumerate(commands, start=1))])

    def opened(i: int, game: str, carrying: str, food: str) -> Trajectory:
        step = Transition(state=page(carrying, "open fridge", f"drop {carrying}"), action="open fridge",
                          next_state=page(carrying, "close fridge", f"drop {carrying}", f"take {food} from fridge"),
                          reward=0.0, done=False, info={"reasoning": "open"})
        return Trajectory(traj_id=f"T{i}", task=Task(task_id=game, instruction=f"cook in {game}", env="toy"),
                          transitions=[step])

    # T0 and T1 open game A's fridge (an egg) carrying different things; T2 opens game B's (milk) carrying a knife.
    trajs = [opened(0, "A", "a cookbook", "egg"), opened(1, "A", "a knife", "egg"), opened(2, "B", "a knife", "milk")]
    assert added_lines(trajs[0].transitions[0].state, trajs[0].transitions[0].next_state) == \
        "[c1] command: close fridge\n[c3] command: take egg from fridge"  # [c2] drop is on the state as [c2]
    buffer = ReplayBuffer.open(tmp_path / "buf", encoder=HashingEncoder())
    buffer.add_trajectories(trajs)
    plain = ProtocolConfig(k=1, neighbour_states=False, system_prompt="", copy_refs=True, element_refs=True)
    tasked = plain.model_copy(update={"task_neighbours": True, "neighbour_changes": True})
    shown = {cfg.task_neighbours: {tr.traj_id: q.retrieved[0] for tr, _, q in exp_queries(trajs, cfg, buffer)}
             for cfg in (plain, tasked)}
    assert shown[False]["T1"].next_state.endswith("take milk from fridge")  # φ's nearest: game B's fridge
    assert shown[True]["T1"].next_state.endswith("take egg from fridge")  # T0: game A's
    query, example = exp_pairs(trajs, tasked, buffer, chat=False)[1]  # T1's one step
    assert isinstance(example.prompt, str) and f"(1) {SAME_TASK_ACTION}" in example.prompt
    assert "⇒ new lines:\n[c1] command: close fridge\n[c3] command: take egg from fridge\n| r=0.00" in example.prompt
    assert "drop a cookbook" not in example.prompt  # T0's unchanged lines are not shown
    parsed = parse_output(example.target, tasked, query=query)  # the target's references read the shown lines
    assert parsed.prediction is not None and parsed.prediction.next_state == trajs[1].transitions[0].next_state
    # The dream's retrieval (ExperienceModel.with_neighbours) follows the model's protocol.
    dreamt = ExperienceQuery("cook in A", [], [], page("a pan", "open fridge", "drop a pan"), "open fridge")
    model = ExperienceModel(object(), ExperienceConfig.from_protocol(tasked), buffer=buffer)  # type: ignore[arg-type]
    served = model.with_neighbours([dreamt])[0]
    assert served.retrieved[0].instruction == "cook in A" and f"(1) {SAME_TASK_ACTION}" in build_user_text(served, tasked)


def test_neighbours_show_real_endings_only_like_the_targets(tmp_path: Path) -> None:
    """A step cut by the step limit (done=True, info.truncated) is not an ending: its target says done=0, and so
    must the neighbour showing it (d=0) and the neighbour a trained model is served at inference."""
    from dreamgym.experience.model import neighbours_of
    from dreamgym.experience.protocol import Neighbour

    def walk(i: int, cut: bool) -> Trajectory:
        steps = [Transition(state=f"[1] text: shelf T{i} aisle {t}", action=f"click[item {t}]",
                            next_state=f"[1] text: shelf T{i} aisle {t + 1}", reward=0.0, done=t == 1,
                            info={"reasoning": "walk", **({"truncated": True} if cut and t == 1 else {})})
                 for t in range(2)]
        return Trajectory(traj_id=f"T{i}", task=Task(task_id=f"task{i}", instruction="walk", env="toy"),
                          transitions=steps)

    cut, ended = walk(0, cut=True), walk(1, cut=False)
    buffer = ReplayBuffer.open(tmp_path / "buf", encoder=HashingEncoder())
    buffer.add_trajectories([cut])
    cfg = ProtocolConfig(k=1, neighbour_states=True, system_prompt="", reasoning=False)
    assert step_target(cut, 1, None, cfg).endswith("<done>0</done> <success>0</success>")
    [(_, _, query)] = [q for q in exp_queries([ended], cfg, buffer) if q[1] == 1]
    assert query.retrieved[0].next_state == cut.transitions[1].next_state and query.retrieved[0].done is False
    [example] = exp_examples([ended], cfg, buffer, chat=False)[1:]
    assert isinstance(example.prompt, str) and "| r=0.00 d=0" in example.prompt
    assert neighbours_of(buffer.retrieve(cut.transitions[1].state, cut.transitions[1].action, k=1))[0].done is False
    assert Neighbour.from_transition(cut.transitions[1]).done is False
    assert Neighbour.from_transition(ended.transitions[1]).done is True
    buffer.close()


def test_cut_neighbour_page_cuts_the_last_neighbour_to_its_first_lines_before_dropping_it() -> None:
    """With ``cut_neighbour_page`` a prompt over its budget keeps its last neighbour's first lines (an open's
    feedback: what the container holds) before it drops it; the history still goes first with
    ``cut_history_first``, and without the option nothing changes."""
    from dreamgym.experience.protocol import (
        MIN_NEIGHBOUR_CHARS,
        Neighbour,
        build_user_text,
        fit_layout,
        shorter_layouts,
    )

    feedback = "[f] feedback: You open the fridge, revealing a red apple and a raw chicken wing."
    page = "\n".join([feedback, *(f"[c{i}] command: take item number {i:02d} from the big fridge" for i in range(9))])
    assert len(page) == 566
    n = Neighbour("location: Kitchen", "open fridge", page, 0.0, False, instruction="cook")
    query = ExperienceQuery("cook", [("location: Hall", "go east"), ("location: Yard", "go west")], [n, n],
                            "location: Kitchen\n[c1] command: open fridge", "open fridge")
    cfg = ProtocolConfig(k=2, history_window=2, cut_neighbour_page=True, reasoning=False, system_prompt="")

    def order(c: ProtocolConfig) -> list[tuple[int, int, int | None]]:
        return [(x.k, x.history_window, x.max_neighbour_chars) for x in shorter_layouts(query, c)]

    # the last neighbour's page halved (566 -> 283 -> 141; 70 is under MIN_NEIGHBOUR_CHARS), then dropped
    assert MIN_NEIGHBOUR_CHARS == 120
    assert order(cfg) == [(1, 2, 600), (1, 2, 283), (1, 2, 141), (0, 2, 600), (0, 1, 600), (0, 0, 600)]
    first = cfg.model_copy(update={"cut_history_first": True})
    assert order(first) == [(2, 1, 600), (2, 0, 600), (1, 0, 600), (1, 0, 283), (1, 0, 141), (0, 0, 600)]
    assert order(cfg.model_copy(update={"cut_neighbour_page": False})) == [(1, 2, 600), (0, 2, 600), (0, 1, 600),
                                                                           (0, 0, 600)]
    # Fitted to a budget the whole page misses, the feedback line stays and the rest is marked cut.
    chars = len
    budget = chars(build_user_text(query, first.model_copy(update={"k": 1, "history_window": 0,
                                                                   "max_neighbour_chars": 141})))
    fitted = fit_layout(query, first, False, lambda p: chars(p.removesuffix("\n")), budget)
    assert fitted is not None and fitted[0].max_neighbour_chars == 141
    assert f"⇒\n{feedback}\n[c0] command: take item number 00 from the big fridge\n…\n| r=0.00" in fitted[1]
    assert "item number 01" not in fitted[1]


def test_sft_shortens_a_long_prompt_by_the_rule_inference_uses(annotated, tmp_path: Path) -> None:
    """A prompt over max_length loses its neighbours first, then its history (oldest first), then state lines;
    the system text and the TASK line stay. Training and inference fit it by one function, so a budget gives
    the same prompt in both; a prompt SFT itself would cut from the left is counted."""
    from dreamgym.experience.protocol import Neighbour, build_messages, fit_prompt, shorter_layouts
    from dreamgym.experience.train import fit_examples
    from dreamgym.sft import TokenizedDataset, encode_target

    traj = next(tr for tr in annotated if len(tr.transitions) >= 4)
    x = traj.transitions[3]
    cfg = ProtocolConfig(k=2, history_window=3)
    query = ExperienceQuery.at_step(traj, 3, [Neighbour(x.state, x.action, x.next_state, 0.0, False)] * 2)
    ex = SFTExample(build_messages(query, cfg), step_target(traj, 3, x.info["reasoning"], cfg))
    _, tokenizer = fresh_tiny_model("micro", annotated, [ex], 512, seed=0)

    def count(p: object) -> int:
        return len(encode_prompt(tokenizer, p))  # type: ignore[arg-type]

    n_target = len(encode_target(tokenizer, ex.target))
    max_length = count(ex.prompt) + n_target - 1  # one token too many
    [fitted], counts = fit_examples(tokenizer, [(query, ex)], cfg, True, max_length)
    assert counts == {"shortened_prompts": 1, "retargeted": 0, "unfit_prompts": 0}
    system, user = fitted.prompt[0]["content"], fitted.prompt[1]["content"]
    assert system == cfg.system_text() and user.startswith(f"TASK: {traj.task.instruction}\nHISTORY:\n#1 ")
    assert "(1)" in user and "(2)" not in user  # the last neighbour went first
    assert TokenizedDataset(tokenizer, [fitted], max_length).cut_prompts == 0
    assert TokenizedDataset(tokenizer, [ex], max_length).cut_prompts == 1  # SFT's own cut is counted

    # Inference fits the same query to the same budget by the same rule.
    class Context:
        max_length = count(ex.prompt) - 1 + 16

        def encode(self, prompt: object) -> list[int]:
            return encode_prompt(tokenizer, prompt)  # type: ignore[arg-type]

    model = ExperienceModel(Context(), ExperienceConfig.from_protocol(cfg, max_new_tokens=16))  # type: ignore[arg-type]
    assert model.fit_context(query, model.prompt(query)) == fitted.prompt and model.shortened_prompts == 1

    # The order: every neighbour, then the oldest history step, ..., then the state; numbers stay absolute.
    layouts = [(c.k, c.history_window, c.max_state_chars) for c in shorter_layouts(query, cfg)]
    assert layouts[:5] == [(1, 3, 1200), (0, 3, 1200), (0, 2, 1200), (0, 1, 1200), (0, 0, 1200)]
    assert all(k == 0 and w == 0 and chars < 1200 for k, w, chars in layouts[5:]) and len(layouts) > 5
    # cut_history_first: the history goes before the neighbour (what the state hides is in the neighbour)
    keep = cfg.model_copy(update={"cut_history_first": True})
    kept = [(c.k, c.history_window, c.max_state_chars) for c in shorter_layouts(query, keep)]
    assert kept[:5] == [(2, 2, 1200), (2, 1, 1200), (2, 0, 1200), (1, 0, 1200), (0, 0, 1200)]
    assert kept[5:] == layouts[5:]  # then the state, as before
    shortened, was_cut = fit_prompt(query, keep, True, count, count(build_messages(query, keep.model_copy(
        update={"history_window": 0}))))
    assert was_cut and "(1)" in shortened[1]["content"] and "(2)" in shortened[1]["content"]  # type: ignore[index]
    assert "HISTORY:" not in shortened[1]["content"]  # type: ignore[index]
    one_step = build_messages(query, cfg.model_copy(update={"k": 0, "history_window": 1}))
    shortened, was_cut = fit_prompt(query, cfg, True, count, count(one_step))
    assert was_cut and shortened == one_step and "HISTORY:\n#3 " in one_step[1]["content"]
    smallest = build_messages(query, cfg.model_copy(update={"k": 0, "history_window": 0, "max_state_chars":
                                                              layouts[-1][2]}))
    assert smallest[1]["content"].startswith(f"TASK: {traj.task.instruction}\nSTATE:\n")
    assert fit_prompt(query, cfg, True, count, count(smallest) - 1) == (None, True)
    assert fit_examples(tokenizer, [(query, ex)], cfg, True, count(smallest) - 1 + n_target)[1]["unfit_prompts"] == 1

    # train-exp reports the counts; the prompts it trains on are never cut from the left.
    write_jsonl(tmp_path / "train.jsonl", annotated)
    sft = SFTConfig(max_steps=1, batch_size=4, max_length=700, num_threads=1, save_steps=100000)
    summary = train_experience_model([tmp_path / "train.jsonl"], "micro", tmp_path / "m",
                                     ProtocolConfig(k=1, history_window=3, reasoning=False), sft, vocab_size=512)
    assert summary["shortened_prompts"] > 0 and summary["cut_prompts"] == 0
    # with copy references, a shortened prompt's target writes out what it can no longer point at
    refs = train_experience_model([tmp_path / "train.jsonl"], "micro", tmp_path / "r", ProtocolConfig(
        k=1, history_window=3, reasoning=False, copy_refs=True, max_state_chars=400), sft, vocab_size=512)
    assert refs["retargeted"] > 0 and refs["cut_prompts"] == 0
    assert summary["examples"] + summary["unfit_prompts"] + summary["dropped_examples"] == summary["transitions"]


def test_prompt_budget_serves_the_trained_layout_and_writes_what_is_left(annotated, tmp_path: Path) -> None:
    """With ``prompt_budget`` a served prompt is fitted to it (not to the context minus the longest answer,
    ``max_new_tokens``), as SFT fitted it, and each row may write what its own prompt leaves of the context, up to
    ``max_new_tokens``; without it (models trained before the field) the old rule holds. train-exp writes the budget:
    the trained length minus the median target, at most the context minus the 0.99 quantile of the targets."""
    from dreamgym.experience.protocol import Neighbour, build_messages
    from dreamgym.experience.train import fit_examples, served_prompt_budget
    from dreamgym.llm.base import Completion
    from dreamgym.sft import encode_target

    traj = next(tr for tr in annotated if len(tr.transitions) >= 4)
    x = traj.transitions[3]
    cfg = ProtocolConfig(k=1, history_window=3)
    query = ExperienceQuery.at_step(traj, 3, [Neighbour(x.state, x.action, x.next_state, 0.0, False)])
    target = step_target(traj, 3, x.info["reasoning"], cfg)
    ex = SFTExample(build_messages(query, cfg), target)
    _, tokenizer = fresh_tiny_model("micro", annotated, [ex], 512, seed=0)
    n_prompt = len(encode_prompt(tokenizer, ex.prompt))

    class Local:  # a local backend's surface: its context, its tokenizer and per-row generation
        max_length = n_prompt + 40

        def __init__(self) -> None:
            self.asked: list[int] = []

        def encode(self, prompt: object) -> list[int]:
            return encode_prompt(tokenizer, prompt)  # type: ignore[arg-type]

        def generate_rows(self, ids: list[list[int]], params: list[object]) -> list[Completion]:
            self.asked += [p.max_new_tokens for p in params]  # type: ignore[attr-defined]
            return [Completion(text=target, token_ids=[1], finish_reason="stop") for _ in ids]

        def generate(self, prompts: list[object], params: object) -> list[Completion]:
            self.asked += [params.max_new_tokens] * len(prompts)  # type: ignore[attr-defined]
            return [Completion(text=target, token_ids=[1], finish_reason="stop") for _ in prompts]

    old = ExperienceModel(Local(), ExperienceConfig.from_protocol(cfg, max_new_tokens=200))  # type: ignore[arg-type]
    assert old.fit_context(query, old.prompt(query)) != old.prompt(query) and old.shortened_prompts == 1
    new_llm = Local()
    new = ExperienceModel(new_llm, ExperienceConfig.from_protocol(  # type: ignore[arg-type]
        cfg, max_new_tokens=200, prompt_budget=n_prompt))
    assert new.fit_context(query, new.prompt(query)) == new.prompt(query) and new.shortened_prompts == 0
    [pred] = new.predict([query])
    assert pred.failure is None and new_llm.asked == [40]  # the context left after the whole prompt
    new.cfg = new.cfg.model_copy(update={"max_new_tokens": 30})
    new.predict([query])
    assert new_llm.asked == [40, 30]  # never more than max_new_tokens

    # SFT fits each prompt to the served budget where that is less than its own target leaves: the same prompt.
    roomy = n_prompt + len(encode_target(tokenizer, target)) + 5
    assert fit_examples(tokenizer, [(query, ex)], cfg, True, roomy)[1]["shortened_prompts"] == 0
    [fitted], counts = fit_examples(tokenizer, [(query, ex)], cfg, True, roomy, served_budget=n_prompt - 1)
    assert counts["shortened_prompts"] == 1
    short = ExperienceModel(Local(), ExperienceConfig.from_protocol(  # type: ignore[arg-type]
        cfg, max_new_tokens=200, prompt_budget=n_prompt - 1))
    assert short.fit_context(query, short.prompt(query)) == fitted.prompt  # served as trained

    # the trained length minus the median target (+1: the end token), at most what leaves the 99th percentile room
    assert served_prompt_budget(list(range(1, 101)), 768, 1024) == 768 - 52
    assert served_prompt_budget([5] * 99 + [500], 1024, 1024) == 1024 - 6
    assert served_prompt_budget([10] * 98 + [350] * 2, 1024, 1024) == 1024 - 351  # room for the long answers
    assert served_prompt_budget([10] * 98 + [950] * 2, 1024, 1024) == 512  # but half the length stays the prompt's
    write_jsonl(tmp_path / "train.jsonl", annotated)
    sft = SFTConfig(max_steps=1, batch_size=4, max_length=700, num_threads=1, save_steps=100000)
    summary = train_experience_model([tmp_path / "train.jsonl"], "micro", tmp_path / "m", ProtocolConfig(k=0), sft,
                                     vocab_size=512)
    saved = json.loads((tmp_path / "m" / "experience.json").read_text())
    assert saved["prompt_budget"] == summary["prompt_budget"] and 1 < saved["prompt_budget"] < 700
    train_experience_model([tmp_path / "train.jsonl"], "micro", tmp_path / "m0", ProtocolConfig(k=0), sft,
                           vocab_size=512, reserve_prompt=False)  # the rule before: served as models trained then
    assert json.loads((tmp_path / "m0" / "experience.json").read_text())["prompt_budget"] is None


def test_mix_resamples_by_kind() -> None:
    examples = [SFTExample(f"p{i}", f"t{i}") for i in range(1000)]
    kinds = ["results", "done"] * 500
    out = mix(examples, kinds, {"results": 0.2, "done": 2.0}, seed=0)
    targets = [ex.target for ex in out]
    assert targets.count("t1") == 2 and sum(int(t[1:]) % 2 == 1 for t in targets) == 1000  # "done" twice each
    assert 60 < sum(int(t[1:]) % 2 == 0 for t in targets) < 140  # "results" kept with probability 0.2
    with pytest.raises(ValueError):
        mix(examples, kinds, {"results": -1.0})


def test_mix_weighs_terminal_outcomes_apart() -> None:
    """``step_kinds`` tags each terminal step with its outcome; ``mix`` takes ``done:failure``'s own weight and falls
    back to the page's (``done``) for an outcome it is not given."""
    from dreamgym.types import Task, Trajectory, Transition

    def traj(reward: float) -> Trajectory:
        page = "[1] text: Thank you for shopping! You bought B0X (no options)\n[2] text: Your score (min 0.0, max 1.0): 1.00"
        steps = [Transition(state="[1] searchbox: search[your query]", action="search[x]",
                            next_state="[1] text: Page 1 (results 1-5 of 9)", reward=0.0, done=False),
                 Transition(state="[1] text: B0X — Lamp", action="click[buy now]", next_state=page, reward=reward,
                            done=True)]
        return Trajectory(task=Task(task_id="shop-train-1", instruction="a lamp"), transitions=steps,
                          success=reward >= 1.0)

    kinds = step_kinds([traj(1.0), traj(0.5)])
    assert kinds == ["results", "done:success", "results", "done:failure"]
    examples = [SFTExample(f"p{i}", f"t{i}") for i in range(4)]
    out = [ex.target for ex in mix(examples, kinds, {"results": 0.0, "done": 2.0, "done:failure": 5.0})]
    assert sorted(out) == ["t1"] * 2 + ["t3"] * 5


def test_tiny_shape_parses_presets_and_sizes() -> None:
    assert tiny_shape("micro") is not None and tiny_shape("models/qwen") is None
    shape = tiny_shape("128x4")
    assert shape is not None and (shape.hidden_size, shape.num_layers, shape.num_heads) == (128, 4, 4)
    with pytest.raises(ValueError):
        tiny_shape("100x2")


@pytest.fixture(scope="module")
def memorised(annotated, tmp_path_factory) -> tuple[Path, list[Trajectory]]:
    """A micro model trained to memorise two short steps: back to search, and a purchase."""
    traj = next(t for t in annotated if t.transitions[-1].done and t.transitions[-1].reward > 0)
    back = next((tr, t) for tr in annotated for t, x in enumerate(tr.transitions) if x.action == "click[back to search]")
    data = [one_step(traj, len(traj.transitions) - 1), one_step(*back)]
    root = tmp_path_factory.mktemp("exp")
    write_jsonl(root / "train.jsonl", data)
    sft = SFTConfig(epochs=80, learning_rate=1e-2, batch_size=2, warmup_ratio=0.0, lr_scheduler="constant",
                    max_length=512, num_threads=2, logging_steps=1000, save_steps=100000)
    summary = train_experience_model([root / "train.jsonl"], "micro", root / "model", COMPACT, sft, vocab_size=512)
    assert summary["examples"] == 2 and summary["steps"] == 80
    return root, data


def test_short_training_memorises_the_targets_under_greedy_decoding(memorised) -> None:
    root, data = memorised
    model = ExperienceModel.load(root / "model")
    assert model.protocol == COMPACT  # experience.json carries the training protocol
    saved = json.loads((root / "model" / "summary.json").read_text())
    assert saved["examples"] == 2 and saved["target_tokens"] > 0 and saved["seconds"] > 0
    predictions = model.predict([ExperienceQuery.at_step(traj, 0) for traj in data])
    for traj, p in zip(data, predictions, strict=True):
        x = traj.transitions[0]
        assert p.failure is None
        assert (p.reasoning, p.next_state, p.reward, p.done) == (
            x.info["reasoning"], x.next_state.strip(), round(x.reward, 2), x.done)


def test_eval_exp_end_to_end_reports_every_key(memorised, annotated) -> None:
    root, _ = memorised
    write_jsonl(root / "heldout.jsonl", annotated[:2])
    result = CliRunner().invoke(app, ["eval-exp", "--model", str(root / "model"), "--data", str(root / "heldout.jsonl"),
                                      "--max-transitions", "6", "--show", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for key in ("reward_accuracy", "terminal_reward_accuracy", "reward_mae", "done_accuracy", "invalid_output_rate",
                "next_state_f1", "epsilon_r", "epsilon_p", "lemma1_bound", "transitions",
                "terminal_reward_majority_baseline", "click_consistency", "reward_consistency",
                "next_state_f1_by_page", "seconds", "steps_per_s", "side_by_side", "done_majority_baseline",
                "reward_majority_baseline", "terminal_reward_exact_accuracy", "purchase_page_consistency"):
        assert key in report, key
    assert report["transitions"] == 6 and len(report["side_by_side"]) == 2


def test_eval_exp_with_a_policy_replays_its_dreamt_episodes_in_the_real_env(memorised, annotated) -> None:
    from dreamgym.llm.tiny import init_tiny_model

    root, _ = memorised
    write_jsonl(root / "heldout.jsonl", annotated[:3])
    init_tiny_model("micro", [root / "heldout.jsonl"], root / "policy", vocab_size=512, seed=0)  # an untrained policy
    args = ["eval-exp", "--model", str(root / "model"), "--data", str(root / "heldout.jsonl"), "--max-transitions", "4",
            "--horizon", "2"]
    result = CliRunner().invoke(app, [*args, "--policy", str(root / "policy"), "--policy-episodes", "2", "--json"])
    assert result.exit_code == 0, result.output
    w2r = json.loads(result.stdout.strip().splitlines()[-1])["wm2real"]
    assert w2r["episodes"] + w2r["unreplayable"] == 2 and w2r["unreplayable"] == 0
    assert 0 < w2r["real_steps"] <= 2 * 2 and w2r["reward_tol"] == 0.1
    assert 0.0 <= w2r["reward_agreement"] <= 1.0 and 0.0 <= w2r["success_agreement"] <= 1.0
    text = CliRunner().invoke(app, [*args, "--policy", str(root / "policy"), "--policy-episodes", "1"])
    assert text.exit_code == 0, text.output
    assert "wm2real_reward_agreement (|Δr| <= 0.1)" in text.stdout and "baseline" in text.stdout
    assert "reward_accuracy (|Δr| <= 0.1)" in text.stdout
    missing = CliRunner().invoke(app, [*args, "--policy", str(root / "nope")])
    assert missing.exit_code != 0 and "no such policy run directory" in str(missing.exception)


def test_train_exp_cli_rejects_bad_input_in_one_line(tmp_path: Path, annotated) -> None:
    write_jsonl(tmp_path / "raw.jsonl", [t.model_copy(update={"transitions": [
        x.model_copy(update={"info": {}}) for x in t.transitions]}) for t in annotated[:1]])
    for args, message in (
        (["--data", str(tmp_path / "nope.jsonl")], "no such trajectory file"),
        (["--data", str(tmp_path / "raw.jsonl")], "has no info.reasoning"),
        (["--data", str(tmp_path / "raw.jsonl"), "--no-reasoning", "--lr", "-1"], "learning_rate"),
    ):
        result = CliRunner().invoke(app, ["train-exp", *args, "--out", str(tmp_path / "m"), "--model", "micro"])
        assert result.exit_code != 0
        assert message in str(result.exception) or message in result.output, (args, result.output, result.exception)


def test_the_time_budget_covers_preparation_and_a_killed_build_leaves_no_half_buffer(
    annotated, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Preparation (buffer, examples, tokenizer) counts against --time-budget; the run's buffer appears only
    once it is complete, so a kill while it is built leaves none (the next attempt builds it afresh)."""
    import dreamgym.experience.train as exp_train

    write_jsonl(tmp_path / "train.jsonl", annotated)
    protocol = ProtocolConfig(k=1, history_window=0, system_prompt="")
    sft = SFTConfig(epochs=1, batch_size=4, max_length=512, num_threads=1, save_steps=100000, time_budget_s=300.0)
    real = exp_train.exp_pairs

    def killed(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt  # a kill after the buffer is written, before training

    monkeypatch.setattr(exp_train, "exp_pairs", killed)
    with pytest.raises(KeyboardInterrupt):
        train_experience_model([tmp_path / "train.jsonl"], "micro", tmp_path / "m", protocol, sft, vocab_size=512)
    assert not (tmp_path / "m" / "buffer").exists()  # only the .partial one, which the next attempt replaces
    monkeypatch.setattr(exp_train, "exp_pairs", real)
    summary = train_experience_model([tmp_path / "train.jsonl"], "micro", tmp_path / "m", protocol, sft,
                                     vocab_size=512)
    assert (tmp_path / "m" / "buffer").is_dir() and not (tmp_path / "m" / "buffer.partial").exists()
    assert len(ReplayBuffer.open(tmp_path / "m" / "buffer", read_only=True, create=False)) > 0
    assert summary["sft"]["time_budget_s"] < 300.0  # the preparation's time came off it
    assert summary["sft"]["time_budget_s"] == pytest.approx(300.0 - summary["prep_seconds"], abs=0.06)


def test_train_exp_reward_head_saves_a_head_that_loading_applies(tmp_path: Path, annotated) -> None:
    write_jsonl(tmp_path / "train.jsonl", annotated)
    result = CliRunner().invoke(app, ["train-exp", "--data", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "m"),
                                      "--model", "micro", "--no-reasoning", "--k", "0", "--epochs", "0.01",
                                      "--threads", "1", "--reward-head"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    ends = [x for t in annotated for x in t.transitions if x.done and not x.info.get("truncated")]
    assert summary["reward_head"]["endings"] == len(ends) >= 2
    assert json.loads((tmp_path / "m" / "experience.json").read_text())["reward_head"] is True
    model = ExperienceModel.load(tmp_path / "m")
    assert model.reward_head is not None and "head_rewards" in model.stats_dict()
    (tmp_path / "m" / "reward_head.json").unlink()
    with pytest.raises(ValueError, match="no reward head"):
        ExperienceModel.load(tmp_path / "m")
