"""The procedural pre-training corpus, `dreamgym model pretrain`, and the shipped base with its manifest."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dreamgym.agent.policy import parse_action
from dreamgym.envs.shop.catalog import build_catalog
from dreamgym.envs.shop.tasks import build_tasks
from dreamgym.experience.protocol import ProtocolConfig, parse_output
from dreamgym.llm.pretrained import (
    ASSET_DIR,
    BaseModelError,
    base_dir,
    base_info,
    pack_base,
    read_manifest,
    resolve_model,
    sha256,
)
from dreamgym.pretrain.corpus import RECIPES, examples


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dreamgym", *args], capture_output=True, text=True, timeout=300)


def text_of(ex) -> str:  # type: ignore[no-untyped-def]
    prompt = ex.prompt if isinstance(ex.prompt, str) else "\n".join(m["content"] for m in ex.prompt)
    return prompt + "\n" + ex.target


@pytest.mark.parametrize("version", sorted(RECIPES))
def test_corpus_is_deterministic_by_seed(version: str) -> None:
    a = [text_of(x) for x in itertools.islice(examples(0, version), 40)]
    b = [text_of(x) for x in itertools.islice(examples(0, version), 40)]
    c = [text_of(x) for x in itertools.islice(examples(1, version), 40)]
    assert a == b
    assert a != c


@pytest.mark.parametrize("version", sorted(RECIPES))
def test_corpus_never_emits_a_shop_title_or_instruction(version: str) -> None:
    catalog = build_catalog(1000, 0)
    shop_texts = {p.title for p in catalog.products} | {p.asin for p in catalog.products}
    shop_texts |= {t.instruction for split in ("train", "test") for t in build_tasks(1000, 0, split, 2000)}
    corpus = "\n".join(text_of(x) for x in itertools.islice(examples(0, version), 600))
    leaked = [s for s in shop_texts if s in corpus]
    assert not leaked, leaked[:5]


def test_corpus_targets_are_well_formed() -> None:
    cfg = ProtocolConfig()
    kinds = {"exp": 0, "agent": 0}
    for ex in itertools.islice(examples(3), 300):
        if ex.target.startswith("<action>"):
            kinds["agent"] += 1
            answer = parse_action(ex.target)
            assert answer is not None and answer.isdigit(), ex.target
            actions = ex.prompt[-1]["content"].split("ACTIONS:\n", 1)[1].splitlines()
            assert 1 <= int(answer) <= len(actions)
        else:
            kinds["exp"] += 1
            pred = parse_output(ex.target, cfg)
            assert pred.ok, (pred.failure, ex.target)
    assert kinds["exp"] > 100 and kinds["agent"] > 20


def test_buy_reward_follows_the_stated_rule() -> None:
    """A purchase's reward is the fraction of wishes its reasoning counts (score m/n=r, written with 2 decimals)."""
    import re

    seen = 0
    for ex in itertools.islice(examples(5), 800):
        m = re.search(r"score (\d+)/(\d+)=(\d\.\d\d) -> done", ex.target)
        if m is None:
            continue
        seen += 1
        met, total, written = int(m.group(1)), int(m.group(2)), m.group(3)
        assert f"{met / total:.2f}" == written
        assert f"<reward>{written}</reward>" in ex.target
        checks = re.findall(r" (y|n)(?=;)", ex.target.split("<think>", 1)[1].split("score", 1)[0])
        assert checks.count("y") == met and len(checks) == total
    assert seen > 50


def test_shipped_base_matches_its_manifest_and_loads() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = read_manifest(ASSET_DIR)
    info = base_info("pretrained")
    assert info["bytes"] <= 10 * 2**20
    assert info["tokens_seen"] == manifest["tokens_seen"] > 0
    for name, digest in manifest["files"].items():
        assert sha256(ASSET_DIR / name) == digest
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(manifest["files"])
    path = resolve_model("pretrained")
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) == manifest["params"]
    # byte-level: any text round-trips; digits are single tokens (copy-friendly)
    text = "ScienceWorld: the thermometer reads 23.5°C — Ω"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids) == text
    assert tokenizer.tokenize("B0N38ATR")[:3] == ["B", "0", "N"]


@pytest.mark.parametrize("name", ["pretrained", "pretrained-policy"])
def test_model_info_json(name: str) -> None:
    r = run("model", "info", name, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert set(got) == {"path", "params", "bytes", "sha256", "tokens_seen"}
    assert got["sha256"] == read_manifest(base_dir(name))["files"]


def test_policy_base_is_packed_and_loads_as_float32() -> None:
    """The policy's base ships at half precision (both bases within 10 MB) and loads as the float32 it was measured
    in, from a manifest that names its pre-training and its packing."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    path = Path(resolve_model("pretrained-policy"))
    manifest = read_manifest(path)
    assert manifest["corpus_version"] == "6" and manifest["copy_warmup"] and manifest["match_warmup"]
    assert manifest["packed"]["dtype"] == "float16" and manifest["packed"]["max_relative_error"] < 1e-3
    assert "dreamgym model pretrain" in manifest["command"]
    assert manifest["packed"]["command"].startswith("dreamgym model pack ")
    assert {t.dtype for t in load_file(str(path / "model.safetensors")).values()} == {torch.float16}
    model = AutoModelForCausalLM.from_pretrained(path)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert sum(p.numel() for p in model.parameters()) == manifest["params"]
    assert base_info("pretrained")["bytes"] + base_info("pretrained-policy")["bytes"] <= 10 * 2**20


def test_pack_halves_the_weights_and_keeps_the_model(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = pack_base("pretrained", tmp_path / "packed", command="dreamgym model pack pretrained --out X")
    assert read_manifest(tmp_path / "packed") == manifest  # every file checks against the new sha256s
    assert manifest["packed"]["from_model_sha256"] == read_manifest(ASSET_DIR)["files"]["model.safetensors"]
    src_bytes = (ASSET_DIR / "model.safetensors").stat().st_size
    assert (tmp_path / "packed" / "model.safetensors").stat().st_size < 0.55 * src_bytes
    tokenizer = AutoTokenizer.from_pretrained(ASSET_DIR)
    ids = tokenizer("[1] button: Buy Now\n[2] option: size 9", return_tensors="pt").input_ids
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(ASSET_DIR)(ids).logits
        b = AutoModelForCausalLM.from_pretrained(tmp_path / "packed")(ids).logits
    assert b.dtype == torch.float32
    assert (a - b).abs().max() < 0.05 * a.abs().max() and torch.equal(a.argmax(-1), b.argmax(-1))
    with pytest.raises(ValueError, match="not empty"):
        pack_base("pretrained", tmp_path / "packed")
    r = run("model", "pack", "pretrained", "--out", str(tmp_path / "p2"), "--dtype", "int8")
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "int8" in lines[0], r.stderr


@pytest.mark.parametrize("damage", ["truncate", "missing", "manifest"])
def test_a_damaged_base_is_a_one_line_error(tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "base"
    shutil.copytree(ASSET_DIR, base, ignore=shutil.ignore_patterns("checkpoints"))
    if damage == "truncate":
        data = (base / "model.safetensors").read_bytes()
        (base / "model.safetensors").write_bytes(data[: len(data) // 2])
        culprit = "model.safetensors"
    elif damage == "missing":
        (base / "tokenizer.json").unlink()
        culprit = "tokenizer.json"
    else:
        (base / "MANIFEST.json").write_text("{not json")
        culprit = "MANIFEST.json"
    r = run("model", "info", str(base))
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and culprit in lines[0] and "dreamgym model pretrain" in lines[0], r.stderr
    import dreamgym.llm.pretrained as pretrained

    monkeypatch.setattr(pretrained, "ASSET_DIR", base)
    with pytest.raises(BaseModelError, match=culprit):
        pretrained.resolve_model("pretrained")


def test_corpus_sites_recur_from_a_pool() -> None:
    """Recipes 2 and 3 draw most sites from a seeded pool, so item ids recur across examples; with no pool
    (recipe 1, the shipped base's) an id is almost never seen twice."""
    import collections
    import re

    def recurring(version: str) -> int:
        ids = collections.Counter(code for x in itertools.islice(examples(0, version), 600)
                                  for code in set(re.findall(r"\b[A-Z][A-Z0-9]{4,9}\b", text_of(x)))
                                  if any(c.isdigit() for c in code))
        return sum(1 for n in ids.values() if n >= 2)

    assert recurring("2") > 100 and recurring("3") > 100 and recurring("1") < 5


class _Oracle:
    """A "model" whose logits put all mass on the true next token (it knows every target): a copier."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def eval(self) -> None:
        pass

    def __call__(self, ids):  # type: ignore[no-untyped-def]
        import torch

        logits = torch.zeros(1, ids.shape[1], self.vocab)
        logits[0, torch.arange(ids.shape[1] - 1), ids[0, 1:]] = 1.0
        return type("Out", (), {"logits": logits})()


def test_copy_probe_separates_a_copier_from_a_format_learner() -> None:
    """The probe scores held-out *fresh-site* targets: the oracle passes, the shipped base's untrained shape
    (same tokenizer, random weights) fails, and always predicting the most common target token fails too."""
    import torch
    from transformers import AutoTokenizer

    from dreamgym.llm.tiny import build_model, tiny_shape
    from dreamgym.pretrain.train import copy_probe

    tokenizer = AutoTokenizer.from_pretrained(ASSET_DIR)
    oracle = copy_probe(_Oracle(len(tokenizer)), tokenizer, per_skill=3)
    assert min(oracle.values()) == 1.0
    fresh = copy_probe(build_model(tiny_shape("micro"), tokenizer, seed=0), tokenizer, per_skill=3)  # type: ignore[arg-type]
    assert max(fresh.values()) < 0.3

    import collections

    counts = collections.Counter(t for x in itertools.islice(examples(9), 200)
                                 for t in tokenizer(x.target, add_special_tokens=False).input_ids)
    common = counts.most_common(1)[0][0]

    class Majority(_Oracle):  # always the corpus's most common target token
        def __call__(self, ids):  # type: ignore[no-untyped-def]
            logits = torch.zeros(1, ids.shape[1], self.vocab)
            logits[..., common] = 1.0
            return type("Out", (), {"logits": logits})()

    assert max(copy_probe(Majority(len(tokenizer)), tokenizer, per_skill=3).values()) < 0.3


def test_answer_probe_scores_whole_answers_beside_the_majority_answer() -> None:
    """The answer probe passes the oracle (every buy score and chosen option whole) and fails a random-init model
    of the base's shape, under either tokenizer style; its majority baseline is a share, below 1."""
    from transformers import AutoTokenizer

    from dreamgym.llm.tiny import build_model, tiny_shape
    from dreamgym.pretrain.train import answer_probe, base_tokenizer

    for tokenizer in (AutoTokenizer.from_pretrained(ASSET_DIR), base_tokenizer(0, 400, "1", "words")):
        oracle = answer_probe(_Oracle(len(tokenizer)), tokenizer, per_skill=8)
        assert {s: a["accuracy"] for s, a in oracle.items()} == {"buy": 1.0, "choose": 1.0, "match": 1.0}
        assert all(0 < a["majority"] < 1 for a in oracle.values())
        fresh = answer_probe(build_model(tiny_shape("micro"), tokenizer, seed=0), tokenizer, per_skill=8)  # type: ignore[arg-type]
        assert max(a["accuracy"] for a in fresh.values()) <= 0.25


def test_pretrain_command_writes_a_checked_base(tmp_path: Path) -> None:
    out = tmp_path / "base"
    r = run("model", "pretrain", "--out", str(out), "--preset", "micro", "--tokens", "20000", "--vocab-size", "400",
            "--batch-size", "8", "--threads", "1", "--corpus-version", "4", "--group-by-length",
            "--induction-steps", "3", "--copy-steps", "2", "--match-steps", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    manifest = read_manifest(out)  # every listed file checks against its sha256
    assert manifest["induction_warmup"]["steps"] == 3 and manifest["sft"]["group_by_length"]
    assert manifest["copy_warmup"]["steps"] == 2 and manifest["copy_warmup"]["corpus_version"] == "4"
    assert manifest["match_warmup"]["steps"] == 2 and manifest["match_warmup"]["skill"] == "match"
    assert 0 < manifest["match_warmup"]["majority"] < 0.2 and "match" in manifest["answer_probe"]
    assert manifest["corpus_version"] == "4"
    assert manifest["tokens_seen"] >= 20000 and manifest["corpus_version"] and not manifest["time_cap_fired"]
    assert "--preset micro" in manifest["command"]
    assert manifest["steps"] == manifest["planned_steps"] > 0
    assert set(manifest["copy_probe"]) >= {"open", "invalid", "buy"} and manifest["init"] is None
    # --init continues that base: its tokenizer and shape, its tokens counted, its origin recorded
    more = tmp_path / "more"
    r = run("model", "pretrain", "--out", str(more), "--init", str(out), "--tokens", "10000", "--seed", "1",
            "--batch-size", "8", "--threads", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    cont = read_manifest(more)
    assert cont["init"]["model_sha256"] == manifest["files"]["model.safetensors"]
    assert cont["tokens_seen"] >= manifest["tokens_seen"] + 10000 and cont["params"] == manifest["params"]
    assert (more / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()
    r = run("model", "pretrain", "--out", str(tmp_path / "bad"), "--preset", "nonsense", "--tokens", "20000")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = run("model", "pretrain", "--out", str(tmp_path / "bad2"), "--init", str(out), "--induction-steps", "5")
    assert r.returncode == 2 and "--induction-steps" in r.stderr and "Traceback" not in r.stderr
    for bad in (["--tokenizer-style", "chars"], ["--tokenizer-style", "words", "--init", str(out)]):
        r = run("model", "pretrain", "--out", str(tmp_path / "bad3"), *bad)
        assert r.returncode == 2 and "--tokenizer-style" in r.stderr and "Traceback" not in r.stderr


def test_induction_warmup_trains_only_on_the_second_showing_and_is_seeded() -> None:
    """The warm-up's rows are random single-byte tokens shown twice; the same seed gives the same weights."""
    import torch
    from transformers import AutoTokenizer

    from dreamgym.llm.tiny import build_model, tiny_shape
    from dreamgym.pretrain.train import induction_warmup

    tokenizer = AutoTokenizer.from_pretrained(ASSET_DIR)
    runs = []
    for seed in (0, 0, 1):
        model = build_model(tiny_shape("micro"), tokenizer, seed=0)  # type: ignore[arg-type]
        report = induction_warmup(model, tokenizer, steps=4, seed=seed, batch_size=4)
        assert report["steps"] == 4 and 0.0 <= report["repeat_accuracy"] <= 1.0
        runs.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_copy_warmup_learns_only_from_echo_targets_and_is_seeded() -> None:
    """The copy warm-up's batches score the echo target (the page, unchanged) and EOS only, never the prompt or the
    padding; the same seed gives the same weights, another seed other weights, and the report carries its steps,
    loss and held-out echo accuracy."""
    import random

    import torch
    from transformers import AutoTokenizer

    from dreamgym.llm.tiny import build_model, tiny_shape
    from dreamgym.pretrain.corpus import example_of
    from dreamgym.pretrain.train import copy_warmup, echo_batch

    tokenizer = AutoTokenizer.from_pretrained(ASSET_DIR)
    rng = random.Random(5)
    examples = [example_of("echo", rng, compact=True) for _ in range(3)]
    batch = echo_batch(tokenizer, examples, max_length=4096)
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    for i, ex in enumerate(examples):
        scored = labels[i][labels[i] != -100].tolist()
        assert scored[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(scored[:-1]) == ex.target  # exactly the target is scored
        n = int(mask[i].sum())
        assert ids[i][n - len(scored):n].tolist() == scored and (labels[i][n:] == -100).all()
    runs = []
    for seed in (0, 0, 1):
        model = build_model(tiny_shape("micro"), tokenizer, seed=0)  # type: ignore[arg-type]
        report = copy_warmup(model, tokenizer, steps=3, seed=seed, batch_size=2, max_length=256)
        assert report["steps"] == 3 and 0.0 <= report["echo_accuracy"] <= 1.0 and report["final_loss"] > 0
        runs.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_match_examples_answer_the_option_the_task_names() -> None:
    """The match skill: the answer is the click of an option value the task names, listed among the actions, not
    yet selected on the page, at a rank that varies (so neither a rank nor a fixed word answers it)."""
    import collections
    import random

    from dreamgym.pretrain.corpus import example_of

    rng = random.Random(11)
    ranks = collections.Counter[int]()
    for _ in range(200):
        ex = example_of("match", rng, compact=True)
        user = ex.prompt[-1]["content"]
        task = user.split("TASK: ", 1)[1].split("\n", 1)[0]
        answer = parse_action(ex.target)
        assert answer is not None and answer.startswith("click[") and not answer[6:-1].isdigit(), ex.target
        value = answer[6:-1]
        assert value in task.replace(",", " ").replace("=", " ").split(), (task, value)
        actions = [line.split(" ", 1)[1] for line in user.split("ACTIONS:\n", 1)[1].splitlines()]
        options = [line.split("option: ", 1)[1] for line in user.splitlines() if "] option: " in line]
        named = [o for o in options if o.split("=", 1)[1].lower() == value]
        assert named and not all(o.endswith("(selected)") for o in named), (options, value)
        ranks[actions.index(answer)] += 1
    assert len(ranks) >= 4 and max(ranks.values()) < 0.5 * 200
    # the answers that need no matching stay far from a matcher's: a random option value, the first unselected one
    from dreamgym.pretrain.corpus import match_baselines

    cheats = match_baselines([example_of("match", rng, compact=True) for _ in range(200)])
    assert 0.2 < cheats["random_option"] < 0.45 and 0.1 < cheats["first_unselected"] < 0.5


def test_recipe_5_answers_agent_steps_in_the_shop_policys_word_format() -> None:
    """Recipe 5's agent examples are in the format the shop policy clones (compact prompt, word answers): a match
    answer is the named value after a space, which is how the task writes it, and the policy's own read-back
    (``env_action``) turns it into the click the oracle took; the cheat answers are as far from it as in click form."""
    import random

    from dreamgym.agent.policy import action_target, build_agent_prompt, env_action
    from dreamgym.pretrain.corpus import WORDS_CONFIG, example_of, match_baselines, match_step

    rng = random.Random(5)
    for _ in range(100):
        obs, action = match_step(rng, compact=True)
        target = action_target(obs, action, WORDS_CONFIG)
        value = action.removeprefix("click[").removesuffix("]")
        assert target == f"<action> {value}</action>", (target, action)
        assert f" {value}" in " " + obs.instruction.lower().replace("=", " ").replace(",", " ")
        assert env_action(target, obs, WORDS_CONFIG) == action
        assert "system" not in [m["role"] for m in build_agent_prompt(obs, WORDS_CONFIG)]  # the compact prompt
    streams = [itertools.islice(examples(0, "5"), 400), itertools.islice(examples(0, "4"), 400)]
    words, clicks = ([e.target for e in s if e.target.startswith("<action>")] for s in streams)
    assert any(t.startswith("<action> ") for t in words) and not any("click[" in t for t in words)
    assert not any(t.startswith("<action> ") for t in clicks)
    same = [match_baselines([example_of("match", random.Random(i), compact=True, words=w) for i in range(100)])
            for w in (True, False)]
    assert same[0] == same[1] and same[0]["random_option"] > 0.2


def test_recipe_6_shows_finished_pages_answered_by_buying() -> None:
    """Recipe 6's match skill: on a page where every option the task names is selected, the answer is the page's buy
    button (read back by the policy as its click); otherwise a named value not yet selected, as in recipe 5."""
    import random

    from dreamgym.agent.policy import action_target, env_action
    from dreamgym.pretrain.corpus import RECIPES, WORDS_CONFIG, match_baselines, match_step

    rng = random.Random(6)
    share = RECIPES["6"].match_finished
    finished = 0
    for _ in range(200):
        obs, action = match_step(rng, compact=True, finished_share=share)
        options = [line.split("option: ", 1)[1] for line in obs.state.splitlines() if "] option: " in line]
        buttons = [line.split("button: ", 1)[1].lower() for line in obs.state.splitlines() if "] button: " in line]
        value = action.removeprefix("click[").removesuffix("]")
        if value in buttons:  # a finished page: every option value the task names is selected
            finished += 1
            named = [o for o in options if f" {o.split('=', 1)[1].removesuffix(' (selected)').lower()}" in
                     f" {obs.instruction.lower().replace('=', ' ')}"]
            assert named and all(o.endswith(" (selected)") for o in named), (obs.instruction, options)
        else:
            assert any(o.lower() == f"{o.split('=', 1)[0].lower()}={value}" for o in options), (options, value)
        assert env_action(action_target(obs, action, WORDS_CONFIG), obs, WORDS_CONFIG) == action
    assert 0.15 * 200 < finished < 0.35 * 200
    from dreamgym.pretrain.corpus import example_of

    cheats = match_baselines([example_of("match", random.Random(i), compact=True, words=True, finished_share=1.0)
                              for i in range(50)])
    assert cheats == {"random_option": 0.0, "first_unselected": 0.0}  # no option answers a finished page


def test_warmups_stop_at_the_time_cap() -> None:
    """The warm-ups obey the pre-training's time cap (a safety limit): past it they stop, and say so."""
    import time

    from transformers import AutoTokenizer

    from dreamgym.llm.tiny import build_model, tiny_shape
    from dreamgym.pretrain.train import skill_warmup

    tokenizer = AutoTokenizer.from_pretrained(ASSET_DIR)
    model = build_model(tiny_shape("micro"), tokenizer, seed=0)  # type: ignore[arg-type]
    late = skill_warmup(model, tokenizer, "echo", steps=3, stream_seed=0, batch_size=2, max_length=512,
                        deadline=time.monotonic() - 1)
    assert late["steps"] == 0 and late["planned_steps"] == 3 and late["time_cap_fired"]
    on_time = skill_warmup(model, tokenizer, "echo", steps=2, stream_seed=0, batch_size=2, max_length=512,
                           deadline=time.monotonic() + 600)
    assert on_time["steps"] == 2 and not on_time["time_cap_fired"]


def test_match_warmup_is_seeded_and_reports_whole_answers() -> None:
    """The match warm-up trains on match examples only, is seeded like the copy warm-up, and reports the held-out
    share of answers predicted whole beside the majority answer's (a fresh model: neither near 1)."""
    import torch
    from transformers import AutoTokenizer

    from dreamgym.llm.tiny import build_model, tiny_shape
    from dreamgym.pretrain.train import match_warmup

    tokenizer = AutoTokenizer.from_pretrained(ASSET_DIR)
    runs = []
    for seed in (0, 0, 1):
        model = build_model(tiny_shape("micro"), tokenizer, seed=0)  # type: ignore[arg-type]
        report = match_warmup(model, tokenizer, steps=2, seed=seed, batch_size=2, max_length=512)
        assert report["skill"] == "match" and report["steps"] == 2 and report["accuracy"] < 0.2
        assert 0 < report["majority"] < 0.2 and 0 < report["random_option"] < 0.5
        runs.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_echo_examples_copy_the_state_unchanged() -> None:
    """Recipe 4's echo skill: an action naming nothing on a page of random fields leaves it as it was."""
    import random

    from dreamgym.pretrain.corpus import example_of

    rng = random.Random(4)
    for _ in range(20):
        ex = example_of("echo", rng, compact=True)
        state = ex.prompt[-1]["content"].split("STATE:\n", 1)[1].split("\nACTION:", 1)[0]
        parsed = parse_output(ex.target, ProtocolConfig()).prediction
        assert parsed is not None and parsed.next_state == state and parsed.reward == 0.0 and not parsed.done


def test_recipe_7_writes_purchases_as_the_shop_default_does() -> None:
    """Recipe 7's purchases: the trace checks the kind first (``type wished=shown y|n``), a purchase of another kind
    scores TYPE_FACTOR of its checks, and the target points at the prompt with copy references (``buy @1.1``) that
    the shop's parser expands back to the trace and page."""
    import random
    import re

    from dreamgym.experience.protocol import ExperienceQuery
    from dreamgym.pretrain.corpus import SHOP_PROTOCOLS, TYPE_FACTOR, Site, _wish, exp_target, step_buy_typed

    rng = random.Random(7)
    cfg = SHOP_PROTOCOLS[0][1]
    assert cfg.copy_refs and cfg.exact_neighbours and cfg.k == 1
    kinds = []
    for _ in range(60):
        site = Site.random(rng, compact=True)
        step = step_buy_typed(site, _wish(site, rng.choice(site.items), rng), rng)
        m = re.fullmatch(r"buy (\S+); type (\S+)=(\S+) ([yn]); .*; score (0\.5\*)?(\d+)/(\d+)=(\d\.\d\d) -> done",
                         step.reasoning)
        assert m, step.reasoning
        same = m[4] == "y"
        kinds.append(same)
        assert (m[2] == m[3]) == same and (m[5] is None) == same and m[1] in step.state.splitlines()[0]
        assert step.reward == round((1.0 if same else TYPE_FACTOR) * int(m[6]) / int(m[7]), 2) == float(m[8])
        query = ExperienceQuery(step.instruction, [("", a) for a in step.history], step.neighbours, step.state,
                                step.action)
        target = exp_target(step, query, cfg)
        assert target.startswith("<think>buy @1.1; type "), target
        parsed = parse_output(target, cfg, query=query).prediction
        assert parsed is not None and parsed.reasoning == step.reasoning and parsed.next_state == step.next_state
        assert parsed.reward == step.reward and parsed.done
    assert 0.5 < sum(kinds) / len(kinds) < 0.9  # both kinds, mostly the wished one


# sha256 of the first 50 examples of seed 0 per recipe, and of the copy probe's first held-out examples: a recipe's
# stream is what its base was trained on, so a change to the generator must not move an existing recipe's draws
# (`dreamgym model pretrain` with a manifest's flags must rebuild that base), and it must not depend on the
# process (the test runs the generator under two PYTHONHASHSEEDs: sets of words once made it do so).
STREAM_SHA256 = {
    "1": "c18862c9a4d68d3405b8d139dc3d348af051773b5839af1abb6b821b1f01fafb",
    "2": "e6fa31f336ce5791498644eba08b1511582c2d091702447834d0f95924adc7f3",
    "3": "241838e125befd754b3b7a8a00df0c3997bbc0c94f67593d8c9de1d05c10d587",
    "4": "bc59ba8dcbc470ec65dbe5d603bdcc1ed7304198aeb9286dd51182db22443e7e",
    "5": "82aae6e8567d4e350d729c417e67f97feacd86fee2d7c243c86d12d82fba642f",
    "6": "18e313dc0b9f65ff0c7d02a4fb8d3d2638441e8c30cf806e6474d5defb35f373",
    "7": "01921d6bb94d330deba1924421ae83abfc0b3c4f9fcc2ca709eb0c1abd43c1eb",
    "probe": "6b03d890c52c93011baf41cd905ecf1227ca43a844d2848cdc661234d2b4a811",
}


def test_recipe_streams_and_the_probe_set_are_pinned() -> None:
    import hashlib
    import random

    from dreamgym.pretrain.corpus import SKILLS, example_of
    from dreamgym.pretrain.train import PROBE_SEED

    def digest(exs) -> str:  # type: ignore[no-untyped-def]
        return hashlib.sha256("\n".join(text_of(x) for x in exs).encode()).hexdigest()

    assert set(RECIPES) == set(STREAM_SHA256) - {"probe"}
    for version in RECIPES:
        assert digest(itertools.islice(examples(0, version), 50)) == STREAM_SHA256[version], version
    rng = random.Random(PROBE_SEED)
    assert digest(example_of(s, rng) for s in SKILLS for _ in range(4)) == STREAM_SHA256["probe"]
    code = ("import hashlib, itertools; from dreamgym.pretrain.corpus import examples; print(hashlib.sha256('\\n'.join("
            "(e.prompt if isinstance(e.prompt, str) else '\\n'.join(m['content'] for m in e.prompt)) + '\\n' + e.target "
            "for e in itertools.islice(examples(0, '1'), 50)).encode()).hexdigest())")
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed})
        assert out.stdout.strip() == STREAM_SHA256["1"], out.stderr[-500:]
