"""The offline baselines: behaviour cloning prompts match acting, BC memorises the oracle, DPO moves the margin."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dreamgym.agent.policy import (
    AgentObservation,
    PolicyConfig,
    action_target,
    build_agent_prompt,
    env_action,
    format_action_target,
    load_policy,
)
from dreamgym.baselines import (
    DPOTrainConfig,
    agent_observations,
    bc_examples,
    on_path,
    preference_margin,
    preference_pairs,
    train_bc,
    train_dpo,
)
from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.envs.base import TextEnv
from dreamgym.envs.pool import env_factory
from dreamgym.rl.evaluate import run_eval_episodes
from dreamgym.sft import SFTConfig, encode_prompt
from dreamgym.types import Task, Trajectory, Transition, write_trajectories

torch.set_num_threads(1)

SHOP = {"num_products": 100}
TASKS = 6  # oracle episodes to clone (~27 steps)
# Tuned for memorising ~27 steps with the micro preset in ~30 s on a loaded 2-core machine.
SFT = SFTConfig(epochs=30, batch_size=4, learning_rate=1e-2, warmup_ratio=0.05, logging_steps=10_000,
                save_steps=10_000, num_threads=1)


@pytest.fixture(scope="module")
def shop() -> TextEnv:
    return make("shop", **SHOP)


@pytest.fixture(scope="module")
def oracle(shop: TextEnv) -> list[Trajectory]:
    return list(iter_episodes(shop, shop.scripted_policy("oracle"), TASKS, seed=0))


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory: pytest.TempPathFactory, oracle: list[Trajectory]) -> Path:
    tmp = tmp_path_factory.mktemp("bc")
    write_trajectories(tmp / "oracle.jsonl", oracle)
    train_bc([tmp / "oracle.jsonl"], "micro", tmp / "run", SFT, PolicyConfig(), vocab_size=1024)
    return tmp / "run"


def traj(task_id: str, actions: list[str], success: bool, invalid: tuple[int, ...] = ()) -> Trajectory:
    steps = [
        Transition(state=f"s{i}", action=a, next_state=f"s{i + 1}", reward=float(success and i == len(actions) - 1),
                   done=i == len(actions) - 1, info={"invalid_action": i in invalid, "admissible_actions": [a, "x"]})
        for i, a in enumerate(actions)
    ]
    return Trajectory(task=Task(task_id=task_id, instruction=f"do {task_id}"), transitions=steps, success=success)


# ------------------------------------------------------------------------------------- unit: the data


def test_bc_examples_are_the_valid_steps_of_successes_with_full_context() -> None:
    data = [traj("a", ["p", "q", "r"], success=True, invalid=(1,)), traj("b", ["p"], success=False)]
    examples = bc_examples(data, PolicyConfig(history_window=1))
    assert [e.target for e in examples] == ["<action>p</action>", "<action>r</action>"]  # failure + invalid out
    prompt = examples[1].prompt  # step 2: the history holds the invalid step too, as acting keeps it
    assert isinstance(prompt, list) and prompt[1]["content"] == "TASK: do a\nSTEP: 2\nHISTORY: q\nSTATE:\ns2\nACTIONS: r | x"
    assert len(bc_examples(data, PolicyConfig(), only_successful=False)) == 3


def test_final_repeat_clones_the_ending_step_again_and_only_it() -> None:
    """final_repeat: the step that ends a cloned trajectory (done) appears K times; a trajectory cut on-path at a
    detour has none."""
    ended = traj("a", ["p", "q", "r"], success=True)
    cut = traj("b", ["p", "q", "s"], success=True)
    cut.transitions[1].info["detour"] = True
    targets = [e.target for e in bc_examples([ended, cut], PolicyConfig(), final_repeat=3, on_path_only=True)]
    assert targets == ["<action>p</action>", "<action>q</action>", *["<action>r</action>"] * 3, "<action>p</action>"]
    assert len(bc_examples([ended], PolicyConfig())) == 3
    with pytest.raises(ValueError, match="final_repeat"):
        bc_examples([ended], PolicyConfig(), final_repeat=0)


def test_noisy_collection_flags_its_detours_and_bc_learns_only_the_oracle_steps() -> None:
    shop = make("shop", **SHOP)
    data = list(iter_episodes(shop, shop.scripted_policy("noisy", seed=3, noise=0.5), 12, seed=0))
    oracle = shop.scripted_policy("oracle")
    steps = [x for t in data for x in t.transitions]
    detours = [x for x in steps if x.info.get("detour")]
    assert 0.3 < len(detours) / len(steps) < 0.7  # noise 0.5
    # a step not flagged is the oracle's own choice: replaying each trajectory, the oracle agrees with it there
    for t in data:
        obs, info = shop.reset(seed=0, options={"task": t.task})
        oracle.reset(shop, t.task)
        for x in t.transitions:
            if not x.info.get("detour"):
                assert oracle.act(obs, info) == x.action
            obs, *_, info = shop.step(x.action)
    cfg = PolicyConfig()
    kept = bc_examples(data, cfg, only_successful=False)
    assert len(kept) == sum(not x.info.get("detour") and not x.info["invalid_action"] for x in steps)
    assert len(bc_examples(data, cfg, only_successful=False, skip_detours=False)) == sum(
        not x.info["invalid_action"] for x in steps)
    # on the oracle's own path: each trajectory's steps before its first detour, and no step after one
    first = [next((i for i, x in enumerate(t.transitions) if x.info.get("detour")), len(t.transitions)) for t in data]
    assert 0 < sum(first) < len(kept) and any(f == 0 for f in first)
    on_path_steps = [(o, x) for t, f in zip(data, first, strict=True)
                     for o, x in list(zip(agent_observations(t), t.transitions, strict=True))[:f]
                     if not x.info["invalid_action"]]
    kept_on_path = bc_examples(data, cfg, only_successful=False, on_path_only=True)
    assert [e.target for e in kept_on_path] == [action_target(o, x.action, cfg) for o, x in on_path_steps]
    assert all(on_path(t).success == t.success for t in data)


def test_decision_repeat_clones_the_envs_decision_steps_k_times_and_nothing_else(oracle: list[Trajectory]) -> None:
    from dreamgym.envs import spec

    is_decision = spec("shop").load("decision_step")
    page = "[1] text: B0X — Sheets\n[2] option: color=red\n[3] option: color=blue\n[4] button: Buy Now"
    assert is_decision(page, "click[red]", ["click[red]", "click[blue]", "click[buy now]"])
    assert not is_decision(page, "click[buy now]", ["click[red]", "click[blue]", "click[buy now]"])
    assert not is_decision("[1] option: color=red", "click[red]", ["click[red]", "click[buy now]"])  # no choice
    cfg = PolicyConfig(action_format="index", answer_by_name=True)
    once = bc_examples(oracle, cfg)
    thrice = bc_examples(oracle, cfg, decision_repeat=3)
    decisions = [x for t in oracle for x in t.transitions
                 if is_decision(x.state, x.action, x.info["admissible_actions"])]
    assert decisions and all(x.action.startswith("click[") for x in decisions)
    assert len(thrice) == len(once) + 2 * len(decisions)
    # the repeats are the option clicks' own examples (the same objects: tokenized once), in order
    targets = [e.target for e in thrice]
    for x in decisions:
        want = action_target(AgentObservation("", x.state, x.info["admissible_actions"], []), x.action, cfg)
        assert targets.count(want) >= 3
    assert len({id(e) for e in thrice}) == len(once)
    # an env without a decision_step clones every step once (and says so); a bad count is an error
    other = Trajectory(task=Task(task_id="a", instruction="do a", env="textworld"), success=True,
                       transitions=traj("a", ["click[red]", "click[blue]"], success=True).transitions)
    assert len(bc_examples([other], cfg, decision_repeat=4)) == 2
    with pytest.raises(ValueError, match="decision_repeat"):
        bc_examples(oracle, cfg, decision_repeat=0)


def test_answer_by_name_clones_word_actions_as_text_and_ids_as_numbers() -> None:
    obs = AgentObservation("i want red sheets", "[1] option: color=red", ["click[b0n38atr]", "click[red]",
                                                                          "click[3 seater]", "click[buy now]"], [])
    cfg = PolicyConfig(action_format="index", answer_by_name=True)
    assert [action_target(obs, a, cfg) for a in obs.admissible_actions] == [
        "<action>1</action>", "<action>click[red]</action>", "<action>click[3 seater]</action>",
        "<action>click[buy now]</action>"]
    plain = PolicyConfig(action_format="index")
    assert action_target(obs, "click[red]", plain) == "<action>2</action>"
    # either answer is read back as the env action
    assert env_action("<action>click[red]</action>", obs, cfg) == env_action("<action>2</action>", obs, cfg) == "click[red]"


def test_word_answers_spell_a_click_as_the_task_does_and_read_back_as_that_click() -> None:
    from transformers import AutoTokenizer

    from dreamgym.llm.pretrained import resolve_model
    from dreamgym.sft import encode_prompt, encode_target

    state = "[1] option: size=12 oz\n[2] option: size=2\n[3] button: Buy Now\n[4] link: B0ZZ11QQ — Sheets | $3.00"
    obs = AgentObservation("i want sheets in size 12 oz", state, ["click[12 oz]", "click[2]", "click[buy now]",
                                                                  "click[b0zz11qq]"], [])
    cfg = PolicyConfig(action_format="index", answer_by_name=True, answer_words=True)
    targets = [action_target(obs, a, cfg) for a in obs.admissible_actions]
    assert targets == ["<action> 12 oz</action>", "<action> 2</action>", "<action> buy now</action>",
                       "<action>4</action>"]
    # each reads back as its click; " 2" is the option's words, "2" the 2nd listed action; unknown words stay invalid
    assert [env_action(t, obs, cfg) for t in targets] == list(obs.admissible_actions)
    assert env_action("<action>2</action>", obs, cfg) == "click[2]"
    assert env_action("<action> 3 oz</action>", obs, cfg) == "3 oz"
    assert env_action("<action>click[buy now]</action>", obs, cfg) == "click[buy now]"
    with pytest.raises(ValueError, match="answer_by_name"):  # words only word answers by name
        PolicyConfig(action_format="index", answer_words=True)
    # HISTORY shows a word click as the words answered, an id click as it is
    seen = AgentObservation(obs.instruction, state, obs.admissible_actions, [("s", "click[b0zz11qq]"), ("s", "click[12 oz]")])
    assert "HISTORY: click[b0zz11qq] ; 12 oz\n" in build_agent_prompt(seen, cfg)[1]["content"]
    # the point of it: the answer's tokens are the task's tokens for the same words (not so after "click[")
    tok = AutoTokenizer.from_pretrained(resolve_model("pretrained"))
    task_ids = encode_prompt(tok, build_agent_prompt(obs, cfg))
    words = encode_target(tok, targets[0])[3:-4]  # between "<action>" and "</action></s>"
    assert tok.convert_ids_to_tokens(words) == ["Ġ", "1", "2", "Ġo", "z"]
    assert any(task_ids[i:i + len(words)] == words for i in range(len(task_ids)))
    plain = encode_target(tok, action_target(obs, "click[12 oz]", cfg.model_copy(update={"answer_words": False})))
    assert not any(plain[i:i + len(words)] == words for i in range(len(plain)))


def test_compact_prompt_lists_only_what_the_state_does_not_show_and_reads_every_action_back() -> None:
    state = ("[1] text: B0N38ATR — Torzu Sheets\n[2] option: color=red (selected)\n[3] option: color=blue\n"
             "[4] button: Buy Now\n[5] link: B0ZZ11QQ — Other Sheets | $3.00")
    history = [("s0", "search[i want blue sheets in queen size under 30 dollars]"), ("s1", "click[b0n38atr]")]
    obs = AgentObservation("i want blue sheets", state, ["click[red]", "click[blue]", "click[buy now]",
                                                         "click[next >]", "click[b0zz11qq]"], history)
    full = PolicyConfig(action_format="index", answer_by_name=True)
    cfg = full.model_copy(update={"prompt": "compact"})
    messages = build_agent_prompt(obs, cfg)
    assert [m["role"] for m in messages] == ["user"]  # no system message
    text = messages[0]["content"]
    # the state's option and button clicks are not listed; a click the state does not name (next >) and ids are
    assert text.endswith("ACTIONS:\n1 click[next >]\n2 click[b0zz11qq]")
    assert "HISTORY: search[i want blue she…] ; click[b0n38atr]" in text  # the long query cut, the id whole
    assert len(text) < len(build_agent_prompt(obs, full)[1]["content"])
    # the targets number the listed actions and name the rest; every admissible action reads back as itself
    targets = [action_target(obs, a, cfg) for a in obs.admissible_actions]
    assert targets == ["<action>click[red]</action>", "<action>click[blue]</action>",
                       "<action>click[buy now]</action>", "<action>click[next >]</action>", "<action>2</action>"]
    assert [env_action(t, obs, cfg) for t in targets] == list(obs.admissible_actions)
    assert env_action("<action>1</action>", obs, cfg) == "click[next >]"
    assert env_action("<action>3</action>", obs, cfg) is None  # only 2 actions are numbered
    # the shop: every page's actions round-trip through the compact targets, with word answers too
    assert_shop_pages_round_trip(cfg)
    assert_shop_pages_round_trip(cfg.model_copy(update={"answer_words": True}))


def test_typed_answers_label_an_action_by_its_element_type_and_rank() -> None:
    state = ("[1] text: B0N38ATR — Torzu Sheets\n[2] option: color=red\n[3] option: color=blue\n[4] button: Buy Now\n"
             "[5] link: B0ZZ11QQ — Other Sheets | $3.00\n[6] searchbox: search[your query]")
    obs = AgentObservation("i want blue sheets", state, ["click[red]", "click[blue]", "click[buy now]",
                                                         "click[b0zz11qq]", "search[blue sheets]", "go north"], [])
    cfg = PolicyConfig(action_format="typed")
    assert [action_target(obs, a, cfg) for a in obs.admissible_actions] == [
        "<action>option 1</action>", "<action>option 2</action>", "<action>button 1</action>",
        "<action>link 1</action>", "<action>searchbox 1</action>", "<action>go 1</action>"]
    assert "option 2: click[blue]" in build_agent_prompt(obs, cfg)[1]["content"]
    # a label is read back as its action; a label the page lacks names nothing; free text passes as it is
    assert [env_action(f"<action>{a}</action>", obs, cfg) for a in ("option 2", "Button 1", "option 3", "link 0")] == [
        "click[blue]", "click[buy now]", None, None]
    assert env_action("<action>search[red sheets]</action>", obs, cfg) == "search[red sheets]"
    # every action of the shop's search, results and item pages round-trips through its label
    assert_shop_pages_round_trip(cfg)


def assert_shop_pages_round_trip(cfg: PolicyConfig) -> None:
    """Every action of a shop episode's search, results and item pages is cloned as a distinct target that
    ``env_action`` reads back as that action."""
    shop = make("shop")
    state, info = shop.reset(seed=0)
    for step in range(3):
        page = AgentObservation(info["task"].instruction, state, info["admissible_actions"], [])
        targets = [action_target(page, a, cfg) for a in page.admissible_actions]
        assert len(set(targets)) == len(targets)
        assert [env_action(t, page, cfg) for t in targets] == list(page.admissible_actions)
        action = f"search[{info['task'].instruction}]" if step == 0 else next(
            a for a in page.admissible_actions if a not in ("click[back to search]", "click[next >]"))
        state, _, _, _, info = shop.step(action)
    assert "option" in state  # the last page checked was an item page with options


def test_preference_pairs_take_the_first_differing_step_against_the_closest_success() -> None:
    data = [
        traj("a", ["s", "k", "buy"], success=True),
        traj("a", ["s", "m", "buy"], success=True),
        traj("a", ["s", "m", "bad"], success=False),  # closest success: the 2nd (prefix 2)
        traj("a", ["s", "m", "bad"], success=False),  # the same pair again: kept once
        traj("a", ["s", "k"], success=False),  # a prefix of a success: no differing step
        traj("b", ["s", "x"], success=False),  # no success of task b
    ]
    pairs = preference_pairs(data, PolicyConfig())
    assert [(p.task_id, p.step, p.chosen, p.rejected) for p in pairs] == [
        ("a", 2, "<action>buy</action>", "<action>bad</action>")
    ]
    assert pairs[0].prompt[1]["content"].startswith("TASK: do a\nSTEP: 2\nHISTORY: s ; m\nSTATE:\ns2")


# ----------------------------------------------------------------------------- behaviour cloning


def test_bc_prompts_are_exactly_what_the_policy_saw_when_acting(sft_run: Path) -> None:
    policy = load_policy(sft_run)
    episodes = run_eval_episodes(policy, env_factory("shop", **SHOP), split="train", episodes=4, num_envs=4)
    compared = 0
    for episode in episodes:
        examples = bc_examples([episode.to_trajectory()], policy.cfg, only_successful=False)
        valid = [t for t in episode.turns if not t.invalid]
        assert [encode_prompt(policy.llm.tokenizer, e.prompt) for e in examples] == [t.prompt_ids for t in valid]
        assert [e.target for e in examples] == [format_action_target(t.action) for t in valid]
        compared += len(valid)
    assert compared >= 8


def test_bc_policy_greedily_reproduces_the_oracle_on_its_training_prompts(
    sft_run: Path, oracle: list[Trajectory]
) -> None:
    summary = json.loads((sft_run / "summary.json").read_text())
    n_steps = sum(t.num_steps for t in oracle)
    assert summary["real_transitions"] == n_steps and summary["examples"] == n_steps
    policy = load_policy(sft_run)
    assert policy.cfg == PolicyConfig()
    observations = [o for t in oracle for o in agent_observations(t)]
    actions = [x.action for t in oracle for x in t.transitions]
    acted = policy.act(observations, greedy=True)
    matched = sum(s.action == a for s, a in zip(acted, actions, strict=True))
    assert matched >= 0.6 * len(actions), f"{matched}/{len(actions)} oracle actions reproduced"
    assert {s.action for s in acted if s.action.startswith("search[")}  # it learned to write queries too


# --------------------------------------------------------------------------------------------- DPO


def test_dpo_raises_the_chosen_vs_rejected_margin(sft_run: Path, shop: TextEnv, tmp_path: Path) -> None:
    data = list(iter_episodes(shop, shop.scripted_policy("oracle"), TASKS, seed=0))
    for seed in range(2):  # the same tasks, played badly
        data += iter_episodes(shop, shop.scripted_policy("noisy", seed=seed, noise=0.7), TASKS, seed=0)
    write_trajectories(tmp_path / "mixed.jsonl", data)
    cfg = DPOTrainConfig(epochs=2, batch_size=8, learning_rate=1e-3, num_threads=1)
    summary = train_dpo([tmp_path / "mixed.jsonl"], sft_run, tmp_path / "dpo", cfg)
    assert summary["pairs"] >= 4 and summary["real_transitions"] == sum(t.num_steps for t in data)
    assert summary["margin_after"] > summary["margin_before"] + 1.0
    policy = load_policy(tmp_path / "dpo")  # the saved weights are the trained ones
    pairs = preference_pairs(data, policy.cfg)
    saved = preference_margin(policy.llm.model, policy.llm.tokenizer, pairs)  # type: ignore[attr-defined]
    assert saved == pytest.approx(summary["margin_after"], abs=1e-3)


def test_dpo_counts_and_reports_pairs_too_long_for_max_length(
    sft_run: Path, oracle: list[Trajectory], tmp_path: Path
) -> None:
    """A pair whose prompt alone fills max_length (TRL would filter it out silently) is left out and counted; a
    pair whose completion TRL cuts is counted; the counts match what TRL's DPOTrainer does with the pairs."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from dreamgym.baselines.dpo import check_pair_lengths, pair_lengths

    data = [*oracle, *(t.model_copy(deep=True, update={"success": False}) for t in oracle[:2])]
    data[-1].transitions[0].action = "search[" + "very " * 100 + "wrong]"  # a long rejected completion
    data[-2].transitions[1].action = "click[next >]"
    write_trajectories(tmp_path / "d.jsonl", data)
    policy_cfg = load_policy(sft_run).cfg
    pairs = preference_pairs(data, policy_cfg)
    tokenizer = AutoTokenizer.from_pretrained(sft_run / "model")
    lengths = sorted((pair_lengths(tokenizer, p), p) for p in pairs)
    assert len(lengths) == 2 and lengths[0][0][0] < lengths[1][0][0]  # two pairs, prompts of different lengths
    (short_prompt, short_chosen, short_rejected), _ = lengths[0]
    long_prompt = lengths[1][0][0]
    assert long_prompt < short_prompt + max(short_chosen, short_rejected)  # one max_length shows both cases
    max_length = long_prompt  # the long prompt fills it; the short pair fits its prompt but not its completion
    kept, counts = check_pair_lengths(tokenizer, pairs, max_length)
    assert counts == {"prompt_too_long": 1, "completion_cut": 1} and kept == [lengths[0][1]]

    # TRL with the same pairs and max_length keeps exactly the pairs counted as trainable, and cuts the completion.
    model = AutoModelForCausalLM.from_pretrained(sft_run / "model")
    dataset = Dataset.from_list([{"prompt": p.prompt, "chosen": [{"role": "assistant", "content": p.chosen}],
                                  "rejected": [{"role": "assistant", "content": p.rejected}]} for p in pairs])
    args = DPOConfig(output_dir=str(tmp_path / "trl"), max_length=max_length, bf16=False, use_cpu=True,
                     report_to=[], disable_tqdm=True, activation_checkpointing=False)
    trainer = DPOTrainer(model=model, ref_model=AutoModelForCausalLM.from_pretrained(sft_run / "model"), args=args,
                         train_dataset=dataset, processing_class=tokenizer)
    [row] = list(trainer.train_dataset)
    assert len(row["prompt_ids"]) == short_prompt and len(row["chosen_ids"]) == short_chosen

    summary = train_dpo([tmp_path / "d.jsonl"], sft_run, tmp_path / "dpo",
                        DPOTrainConfig(epochs=1, batch_size=2, num_threads=1, max_length=max_length))
    assert (summary["pairs"], summary["trained_pairs"]) == (2, 1)
    assert (summary["pairs_prompt_too_long"], summary["pairs_completion_cut"]) == (1, 1)


# --------------------------------------------------------------------------------------------- CLI


def test_cli_dpo_writes_a_policy_run(sft_run: Path, oracle: list[Trajectory], tmp_path: Path) -> None:
    from dreamgym.cli import app

    data = [*oracle, *(t.model_copy(deep=True, update={"success": False}) for t in oracle[:2])]  # a failure per task…
    data[-1].transitions[0].action = "search[wrong]"  # …that departs from the success at step 0
    data[-2].transitions[1].action = "click[next >]"
    write_trajectories(tmp_path / "d.jsonl", data)
    out = tmp_path / "dpo"
    r = CliRunner().invoke(app, ["baseline", "dpo", "--data", str(tmp_path / "d.jsonl"), "--init", str(sft_run),
                                 "--out", str(out), "--epochs", "1", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["pairs"] == 2
    assert (out / "model" / "model.safetensors").is_file() and (out / "policy.json").is_file()


def test_cli_sft_without_successes_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dreamgym.cli import main

    write_trajectories(tmp_path / "fail.jsonl", [traj("a", ["p"], success=False)])
    argv = ["dreamgym", "baseline", "sft", "--data", str(tmp_path / "fail.jsonl"), "--model", "micro",
            "--out", str(tmp_path / "run")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        main()
    lines = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.strip()]
    assert exit_info.value.code == 2 and len(lines) == 1 and "no successful trajectories" in lines[0], lines


def test_cli_sft_defaults_to_index_actions_and_takes_the_format(oracle: list[Trajectory], tmp_path: Path) -> None:
    """The README's quick tour (``baseline sft`` then ``train``) gets the CPU default's index actions."""
    from dreamgym.cli import app

    write_trajectories(tmp_path / "d.jsonl", oracle)
    for fmt, args in (("index", []), ("text", ["--action-format", "text"])):
        out = tmp_path / fmt
        r = CliRunner().invoke(app, ["baseline", "sft", "--data", str(tmp_path / "d.jsonl"), "--model", "micro",
                                     "--out", str(out), "--epochs", "0.2", "--threads", "1", *args])
        assert r.exit_code == 0, r.output
        assert PolicyConfig.model_validate_json((out / "policy.json").read_text()).action_format == fmt
    r = CliRunner().invoke(app, ["baseline", "sft", "--data", str(tmp_path / "d.jsonl"), "--out",
                                 str(tmp_path / "x"), "--action-format", "numbers"])
    assert r.exit_code != 0 and not (tmp_path / "x").exists()
    r = CliRunner().invoke(app, ["baseline", "sft", "--data", str(tmp_path / "d.jsonl"), "--model", "micro",
                                 "--out", str(tmp_path / "c"), "--epochs", "0.2", "--threads", "1", "--prompt",
                                 "compact", "--answer-by-name", "--answer-words"])
    assert r.exit_code == 0, r.output
    saved = PolicyConfig.model_validate_json((tmp_path / "c" / "policy.json").read_text())
    assert (saved.prompt, saved.answer_by_name, saved.answer_words) == ("compact", True, True)
    r = CliRunner().invoke(app, ["baseline", "sft", "--data", str(tmp_path / "d.jsonl"), "--out",
                                 str(tmp_path / "x"), "--prompt", "short"])
    assert r.exit_code == 2 and not (tmp_path / "x").exists()
    r = CliRunner().invoke(app, ["baseline", "sft", "--data", str(tmp_path / "d.jsonl"), "--out",
                                 str(tmp_path / "x"), "--decision-repeat", "0"])
    assert r.exit_code == 2 and not (tmp_path / "x").exists()
    r = CliRunner().invoke(app, ["baseline", "sft", "--data", str(tmp_path / "d.jsonl"), "--model", "micro", "--out",
                                 str(tmp_path / "rep"), "--epochs", "0.2", "--threads", "1", "--decision-repeat", "3",
                                 "--on-path"])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    n_decisions = (summary["examples"] - summary["distinct_examples"]) // 2
    assert summary["decision_repeat"] == 3 and n_decisions > 0 and summary["on_path_only"] is True
    assert summary["examples"] == len(bc_examples(oracle, PolicyConfig(action_format="index"))) + 2 * n_decisions


def test_bc_time_budget_covers_preparation(oracle: list[Trajectory], tmp_path: Path) -> None:
    """Reading the data and building the tokenizer count against --time-budget (issue 17: every budget covers
    every stage)."""
    write_trajectories(tmp_path / "d.jsonl", oracle)
    sft = SFTConfig(epochs=0.2, batch_size=8, num_threads=1, save_steps=100000, time_budget_s=300.0)
    summary = train_bc([tmp_path / "d.jsonl"], "micro", tmp_path / "run", sft, PolicyConfig(action_format="index"))
    assert summary["sft_config"]["time_budget_s"] < 300.0  # the preparation's time came off it
    assert summary["sft_config"]["time_budget_s"] == pytest.approx(300.0 - summary["prep_seconds"], abs=0.06)
    assert summary["time_cap_fired"] is False  # the epochs ended first


def test_a_time_cap_that_cuts_the_schedule_short_is_reported(oracle: list[Trajectory], tmp_path: Path) -> None:
    """time_budget_s is a safety cap: when it stops training before the epochs end, the summary says so."""
    write_trajectories(tmp_path / "d.jsonl", oracle)
    sft = SFTConfig(epochs=1000, batch_size=8, num_threads=1, save_steps=100000, time_budget_s=1.0)
    summary = train_bc([tmp_path / "d.jsonl"], "micro", tmp_path / "run", sft, PolicyConfig(action_format="index"))
    assert summary["time_cap_fired"] is True and summary["epochs"] < 1000


def test_flush_denormal_holds_only_while_training(oracle: list[Trajectory], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """SFTConfig.flush_denormal treats subnormal floats as zero during training (the policy's base makes them in
    its backward pass: benchmarks/results/base_step_speed.json) and leaves the process as it found it."""
    import dreamgym.sft as sft_module

    def flushed() -> bool:
        return float((torch.tensor([1e-39]) * 1.0).item()) == 0.0  # 1e-39 is subnormal in float32

    seen: list[bool] = []
    real_train = sft_module._train

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(flushed())
        return real_train(*args, **kwargs)

    monkeypatch.setattr(sft_module, "_train", spy)
    write_trajectories(tmp_path / "d.jsonl", oracle)
    for flag in (True, False):
        sft = SFTConfig(max_steps=2, batch_size=8, num_threads=1, save_steps=100000, flush_denormal=flag)
        summary = train_bc([tmp_path / "d.jsonl"], "micro", tmp_path / f"run{flag}", sft, PolicyConfig())
        assert summary["steps"] == 2
        assert not flushed()
    assert seen == [True, False]
