"""Tiny models and the ``hf`` backend: tokenizer round trips, Auto* loading, batching, stops, seeds, log-probs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from dreamgym.llm import LLM, LLMConfig, SamplingParams, load_llm
from dreamgym.llm.hf import HFLLM
from dreamgym.llm.tiny import END_THINK, THINK, build_tokenizer, corpus_texts, init_tiny_model
from dreamgym.types import DataError, Task, Trajectory, Transition, write_trajectories

torch.set_num_threads(1)

WORDS = ["red", "blue", "shirt", "cotton", "size", "small", "price", "search", "buy", "click", "page", "next"]
PROMPTS = ["[1] search: red", "click[buy now] on the blue cotton shirt page", "size", "results next page price 12.50"]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


def write_corpus(path: Path, lines: int = 400) -> Path:
    rng = random.Random(0)
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(10)) for _ in range(lines)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def micro_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("micro")
    out = tmp / "model"
    init_tiny_model("micro", [write_corpus(tmp / "corpus.txt")], out, seed=0)
    return out


@pytest.fixture(scope="module")
def llm(micro_dir: Path) -> HFLLM:
    return HFLLM.from_pretrained(micro_dir)


# ----------------------------------------------------------------------------------------- tiny models


def test_tokenizer_round_trips_text_and_chat_template_after_save_load(micro_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(micro_dir)
    text = f"{THINK}price 12.50 <= 30 ok{END_THINK}\n[3] button: Buy Now — é ✓"
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text  # byte-level: nothing is unknown
    assert tok.convert_tokens_to_ids(THINK) in ids and tok.convert_tokens_to_ids(END_THINK) in ids
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "buy a red shirt"}]
    chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat == "<s><|system|>\nbe brief</s>\n<|user|>\nbuy a red shirt</s>\n<|assistant|>\n"
    chat_ids = tok(chat, add_special_tokens=False).input_ids
    assert tok.decode(chat_ids) == chat
    assert chat_ids.count(tok.eos_token_id) == 2
    assert tok.pad_token == "<pad>" and tok.padding_side == "left"


def test_model_dir_loads_with_auto_classes(micro_dir: Path) -> None:
    assert (micro_dir / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(micro_dir)
    tok = AutoTokenizer.from_pretrained(micro_dir)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.1e6 <= n_params <= 0.5e6
    assert model.config.vocab_size == len(tok)
    assert model.config.eos_token_id == tok.eos_token_id and model.config.pad_token_id == tok.pad_token_id
    with torch.no_grad():
        logits = model(torch.tensor([tok("red shirt").input_ids])).logits
    assert logits.shape[-1] == len(tok)


def test_init_is_seeded_and_refuses_a_nonempty_dir(micro_dir: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "c.txt")
    a = init_tiny_model("micro", [corpus], tmp_path / "a", seed=0)
    b = init_tiny_model("micro", [corpus], tmp_path / "b", seed=0)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match="not empty"):
        init_tiny_model("micro", [corpus], tmp_path / "a")
    with pytest.raises(ValueError, match="unknown preset"):
        init_tiny_model("huge", [corpus], tmp_path / "c")


def test_corpus_from_trajectories(tmp_path: Path) -> None:
    state = "[1] link: B0042 cotton shirt\n[2] button: Next >"
    trans = [Transition(state=state, action="click[b0042]", next_state="[1] button: Buy Now", reward=1.0, done=True)]
    trajs = [Trajectory(task=Task(task_id=f"t{i}", instruction="buy a cotton shirt"), transitions=trans) for i in range(50)]
    path = tmp_path / "trajs.jsonl"
    write_trajectories(path, trajs)
    texts = list(corpus_texts([path]))
    assert texts[:4] == ["buy a cotton shirt", state, "click[b0042]", "[1] button: Buy Now"]
    tok = build_tokenizer(corpus_texts([path]), vocab_size=400)
    assert len(tok(" cotton", add_special_tokens=False).input_ids) == 1  # a frequent word became one token
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:1"):
        build_tokenizer(corpus_texts([tmp_path / "bad.jsonl"]), vocab_size=400)


# --------------------------------------------------------------------------------------- hf backend


def test_load_llm_gives_an_hf_backend(micro_dir: Path) -> None:
    backend = load_llm(LLMConfig(backend="hf", model=str(micro_dir), max_batch_size=2))
    assert isinstance(backend, HFLLM) and isinstance(backend, LLM)
    assert backend.model is not None and backend.tokenizer is not None


def test_batched_greedy_equals_unbatched(llm: HFLLM, micro_dir: Path) -> None:
    batched = llm.generate(PROMPTS, GREEDY)
    for prompt, c in zip(PROMPTS, batched, strict=True):
        alone = llm.generate([prompt], GREEDY)[0]
        assert c.token_ids == alone.token_ids and c.text == alone.text
        assert c.prompt_ids == llm.encode(prompt) and c.finish_reason == "length" and len(c.token_ids) == 12
    # batches larger than max_batch_size are split (and regrouped by length) without changing anything
    split = HFLLM(llm.model, llm.tokenizer, max_batch_size=3).generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in split] == [c.token_ids for c in batched]
    # the same as transformers' own generate on the same left-padded batch
    enc = llm.tokenizer(PROMPTS, return_tensors="pt", padding=True)
    ref = llm.model.generate(**enc, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert [row[enc.input_ids.shape[1] :].tolist() for row in ref] == [c.token_ids for c in batched]


def test_rows_joining_a_running_batch_decode_as_if_alone(llm: HFLLM) -> None:
    ids = [llm.encode(p) for p in PROMPTS]
    alone = [c.token_ids for c in llm.generate_ids(ids, GREEDY)]
    with torch.inference_mode():
        batch = llm.new_batch()
        first = batch.add(ids[:2], [GREEDY] * 2)
        for _ in range(5):
            batch.step()
        later = batch.add(ids[2:], [GREEDY] * 2)  # shorter and longer prompts join mid-decode
        while batch.active:
            batch.step()
    assert batch.can_join()
    assert [r.token_ids for r in first + later] == alone


def test_chat_prompts_use_the_template(llm: HFLLM) -> None:
    messages = [{"role": "user", "content": "buy a red shirt"}]
    ids = llm.encode(messages)
    assert llm.tokenizer.decode(ids).endswith("<|assistant|>\n") and ids[0] == llm.tokenizer.bos_token_id
    assert llm.generate([messages], GREEDY)[0].token_ids == llm.generate_ids([ids], GREEDY)[0].token_ids
    with pytest.raises(ValueError, match="chat prompt"):
        llm.encode([{"role": "user"}])


def test_stop_strings_truncate_text_and_token_ids(llm: HFLLM) -> None:
    full = llm.generate(PROMPTS, SamplingParams(max_new_tokens=30, temperature=0.0))
    stops = [c.text[3:6] for c in full]  # a string that greedy decoding produces a few characters in
    for prompt, c, stop in zip(PROMPTS, full, stops, strict=True):
        cut = llm.generate([prompt], SamplingParams(max_new_tokens=30, temperature=0.0, stop=[stop, "never"]))[0]
        assert cut.finish_reason == "stop"
        assert cut.text == c.text[: c.text.find(stop)]
        assert cut.token_ids == c.token_ids[: len(cut.token_ids)]  # a prefix, ending at the stop's last token
        assert stop in llm.tokenizer.decode(cut.token_ids)
        assert stop not in llm.tokenizer.decode(cut.token_ids[:-1])


def test_eos_ends_a_row_and_is_kept_in_token_ids(llm: HFLLM) -> None:
    first = llm.generate(PROMPTS[:1], GREEDY)[0].token_ids[0]
    eos_llm = HFLLM(llm.model, llm.tokenizer)
    eos_llm.eos_ids = {first}  # pretend the first greedy token is EOS
    c = eos_llm.generate(PROMPTS, GREEDY)[0]
    assert c.finish_reason == "stop" and c.token_ids == [first] and c.text == ""


def test_seeded_sampling_is_reproducible_and_batch_independent(llm: HFLLM) -> None:
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=7)
    a = llm.generate(PROMPTS, params)
    assert [c.token_ids for c in a] == [c.token_ids for c in llm.generate(PROMPTS, params)]
    # prompt i is sampled with seed + i, whoever shares its batch
    alone = llm.generate([PROMPTS[2]], SamplingParams(max_new_tokens=16, temperature=1.0, seed=9))[0]
    assert alone.token_ids == a[2].token_ids
    # a GRPO group (the same prompt repeated) gets different samples
    group = llm.generate([PROMPTS[0]] * 4, params)
    assert len({tuple(c.token_ids) for c in group}) == 4
    other = llm.generate(PROMPTS, SamplingParams(max_new_tokens=16, temperature=1.0, seed=8))
    assert [c.token_ids for c in other] != [c.token_ids for c in a]


def test_tiny_top_p_is_greedy(llm: HFLLM) -> None:
    nucleus = llm.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1e-6, seed=1))
    assert [c.token_ids for c in nucleus] == [c.token_ids for c in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_match_a_forward_pass(llm: HFLLM, temperature: float) -> None:
    params = SamplingParams(max_new_tokens=10, temperature=temperature, seed=3, logprobs=True)
    for c in llm.generate(PROMPTS, params):
        assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
        assert c.prompt_ids is not None
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            logits = llm.model(ids).logits[0, len(c.prompt_ids) - 1 : -1]
        ref = F.log_softmax(logits / (temperature or 1.0), dim=-1).gather(-1, ids[0, len(c.prompt_ids) :, None])[:, 0]
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)
    assert llm.generate(PROMPTS[:1], GREEDY)[0].logprobs is None


CHOICES = ("<action>click[red shirt]</action>", "<action>click[blue]</action>", "<action>2</action>")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_guided_choice_gives_one_of_the_choices_with_renormalised_logprobs(llm: HFLLM, temperature: float) -> None:
    params = SamplingParams(max_new_tokens=30, temperature=temperature, seed=5, logprobs=True, stop=["</action>"],
                            choices=CHOICES)
    ids = {c: llm.tokenizer(c, add_special_tokens=False).input_ids for c in CHOICES}
    free = llm.generate(PROMPTS, SamplingParams(max_new_tokens=30, temperature=0.0, stop=["</action>"]))
    assert not any(f.text + "</action>" in CHOICES for f in free)  # an untrained model writes none of them
    for c in llm.generate(PROMPTS * 3, params):
        choice = next(x for x, t in ids.items() if t == c.token_ids)  # exactly one choice's tokens
        assert c.finish_reason == "stop" and c.text == choice[: -len("</action>")]
        assert c.logprobs is not None and all(lp <= 1e-6 for lp in c.logprobs)
        # where only one choice continues the prefix, its token has probability 1 under the guided distribution
        for n, lp in enumerate(c.logprobs):
            if len({t[n] for t in ids.values() if len(t) > n and t[:n] == c.token_ids[:n]}) == 1:
                assert lp == pytest.approx(0.0, abs=1e-6)
    # without a stop string the text is the whole choice
    bare = llm.generate(PROMPTS[:1], SamplingParams(max_new_tokens=30, temperature=0.0, choices=CHOICES))[0]
    assert bare.text in CHOICES
    with pytest.raises(ValueError, match="choices"):
        SamplingParams(choices=[])


def test_bad_prompts_and_params_raise(llm: HFLLM) -> None:
    with pytest.raises(ValueError, match="empty prompt"):
        llm.generate_ids([[]], GREEDY)
    with pytest.raises(ValueError, match="out of range"):
        llm.generate_ids([[1, 10**6]], GREEDY)
    with pytest.raises(ValueError, match="context"):
        llm.generate_ids([[1] * 1000], SamplingParams(max_new_tokens=100))
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_model_init_and_serve_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from dreamgym.cli import app

    corpus = write_corpus(tmp_path / "corpus.txt")
    out = tmp_path / "model"
    result = CliRunner().invoke(app, ["model", "init", "--preset", "micro", "--corpus", str(corpus), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "micro model" in result.output
    assert HFLLM.from_pretrained(out).generate(["red"], GREEDY)[0].finish_reason == "length"
    monkeypatch.delenv("DG_UNSET_KEY", raising=False)
    result = CliRunner().invoke(app, ["serve", str(out), "--api-key-env", "DG_UNSET_KEY"])
    assert isinstance(result.exception, ValueError) and "DG_UNSET_KEY" in str(result.exception)


def test_tokenizer_building_cuts_a_pathological_line(caplog: pytest.LogCaptureFixture) -> None:
    """A 5 MB single line is cut to TOKENIZER_TEXT_CHARS (counted and logged), so building stays bounded."""
    import random

    from dreamgym.llm.tiny import TOKENIZER_TEXT_CHARS, build_tokenizer

    rng = random.Random(0)
    huge = "".join(rng.choice("abcdefghij klmnop") for _ in range(5_000_000))
    with caplog.at_level("WARNING", logger="dreamgym.llm.tiny"):
        tok = build_tokenizer(["[1] button: Buy Now", huge, "search[red shoes]"], 400)
    assert any(f"1 cut to {TOKENIZER_TEXT_CHARS}" in r.getMessage() for r in caplog.records)
    assert tok.decode(tok("search[red shoes]", add_special_tokens=False).input_ids) == "search[red shoes]"


def test_words_tokenizer_gives_a_word_the_same_tokens_wherever_it_stands() -> None:
    """The ``words`` style: a task's word and the same word in an action or a page (after a space, a bracket, an
    ``=``, capitalised) are the same token ids; ids match across case letter by letter; decoding is lossless."""
    from dreamgym.llm.tiny import CASE_MARK, build_tokenizer

    texts = ["i want lamb flavor dog food in size 30 lb", "[6] option: flavor=lamb (selected)", "click[lamb]",
             "[1] text: B0MBYH8H Detor Grain Free Dog Food", "grain free lamb"] * 40
    words, gpt2 = build_tokenizer(texts, 300, style="words"), build_tokenizer(texts, 300)

    def ids(tok: object, text: str) -> list[int]:
        return tok(text, add_special_tokens=False).input_ids  # type: ignore[operator,no-any-return]

    lamb = ids(words, "lamb")
    for text in ("in lamb flavor", "click[lamb]", "flavor=lamb (selected)"):
        seq = ids(words, text)
        assert any(seq[i:i + len(lamb)] == lamb for i in range(len(seq))), text
    mark = ids(words, CASE_MARK)
    assert ids(words, "Grain") == mark + ids(words, "grain")
    id_upper, id_lower = ids(words, "B0MBYH8H"), ids(words, "b0mbyh8h")
    assert [t for t in id_upper if t not in mark] == id_lower and len(id_lower) == 8  # one token a character
    # The GPT-2 style does not have the property (the reason for the style): " lamb" and "[lamb" differ.
    assert ids(gpt2, " lamb")[-1] not in ids(gpt2, "click[lamb]")
    for text in ("[1] text: B0MBYH8H Detor Grain Free Dog Food, ŽŸ ☃\n\tx  y", "Search[Red SHOES] $12.50"):
        assert words.decode(ids(words, text)) == text
    with pytest.raises(ValueError, match="tokenizer style"):
        build_tokenizer(texts, 300, style="spaces")
