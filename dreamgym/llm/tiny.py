"""Tiny models for the CPU default: a byte-level BPE tokenizer trained on a corpus and a small Llama.

The result is a normal Hugging Face model directory (``config.json``, ``model.safetensors``,
``tokenizer.json``, chat template) that ``AutoModelForCausalLM`` / ``AutoTokenizer`` and every backend load,
so the CPU default runs exactly the code a GPU user runs with a 7B checkpoint.

Presets (parameter counts with the default vocabulary):

* ``micro``: 2 layers x 64 hidden, vocab 512, ~0.2M params; for tests (loads and generates in milliseconds).
* ``small``: 4 layers x 256 hidden, vocab 2048, ~3.7M params; for the demo.
* ``base``:  6 layers x 512 hidden, vocab 4096, ~21M params.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from dreamgym.types import DataError, read_trajectories

log = logging.getLogger(__name__)

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
THINK, END_THINK = "<think>", "</think>"
# Role markers of the chat template: special tokens, so each is one id and `skip_special_tokens` drops it.
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")

# `<s><|user|>\nhello</s>\n<|assistant|>\n` ... the assistant's turn ends with `</s>` (the EOS id), so a
# generation stops where a chat turn ends.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

TRAJECTORY_SUFFIXES = {".jsonl", ".parquet"}


@dataclass(frozen=True)
class TinyPreset:
    """Architecture of a tiny Llama; ``vocab_size`` is the default BPE vocabulary of the preset."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int


PRESETS: dict[str, TinyPreset] = {
    "micro": TinyPreset(64, 2, 4, 256, vocab_size=512, max_position_embeddings=1024),
    "small": TinyPreset(256, 4, 4, 688, vocab_size=2048, max_position_embeddings=2048),
    "base": TinyPreset(512, 6, 8, 1376, vocab_size=4096, max_position_embeddings=2048),
}


def tiny_shape(spec: str) -> TinyPreset | None:
    """A tiny-model shape: a preset name (``micro``/``small``/``base``) or ``<hidden>x<layers>`` (e.g. ``128x4``:
    heads of 32 dimensions, MLP 4x hidden, vocabulary 2048); None when ``spec`` is neither (a model path)."""
    if spec in PRESETS:
        return PRESETS[spec]
    match = re.fullmatch(r"(\d+)x(\d+)", spec)
    if match is None:
        return None
    hidden, layers = int(match.group(1)), int(match.group(2))
    if hidden % 32 or layers < 1:
        raise ValueError(f"tiny shape {spec!r}: hidden must be a multiple of 32 and layers >= 1")
    return TinyPreset(hidden, layers, hidden // 32, 4 * hidden, vocab_size=2048, max_position_embeddings=1024)


# ------------------------------------------------------------------------------------------ corpus


def corpus_texts(paths: Sequence[str | os.PathLike[str]]) -> Iterator[str]:
    """Yield training text from files: trajectory files (``.jsonl``/``.parquet``) give their instructions,
    states and actions; any other file is read as plain text, one line per item."""
    if not paths:
        raise ValueError("the tokenizer corpus is empty: give at least one --corpus file")
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such corpus file")
        if p.suffix in TRAJECTORY_SUFFIXES:
            for traj in read_trajectories(p):
                yield traj.task.instruction
                for t in traj.transitions:
                    yield t.state
                    yield t.action
                if traj.transitions:
                    yield traj.transitions[-1].next_state
        else:
            with p.open(encoding="utf-8", errors="replace") as f:
                yield from (line.rstrip("\n") for line in f if line.strip())


# ---------------------------------------------------------------------------------------- tokenizer


# Caps on the text a BPE is trained on: merges come from local statistics, so the head of a long text and the
# first tens of MB of a corpus teach them as well as the rest, while one pathological 50 MB line would stall the
# trainer for minutes at GBs of memory. Cuts are counted and logged.
TOKENIZER_TEXT_CHARS = 8192
TOKENIZER_CORPUS_CHARS = 64_000_000


# The ``words`` tokenizer style: a word is the same tokens wherever it stands. GPT-2's byte-level BPE glues the
# space to the next word, so "lamb" in "in lamb flavor" (` l` `am` `b`) and in "click[lamb]" (`la` `mb`) share no
# token, nor do "Grain" and "grain": a small model then has to learn spelling before it can match an option or
# an attribute with the task's words (issue 12's compare skill). Here a capital letter becomes CASE_MARK + the
# lower-case letter (normalizer; the decoder undoes it), every whitespace, digit and punctuation character is a
# token of its own, and so is every letter of an identifier with a digit in it (``B0QH9VSU`` and the click
# ``b0qh9vsu`` are then the same letter tokens); BPE merges only inside a run of lower-case letters.
CASE_MARK = "\ue000"  # a private-use character: text that contains it decodes without it (counted nowhere: rare)
_ID_CHAR = f"[a-z0-9{CASE_MARK}]"
WORD_SPLIT = (rf"\s|[^a-z\s]|[a-z](?={_ID_CHAR}*[0-9])|"
              + "|".join(f"(?<=[0-9]{_ID_CHAR}{{{i}}})[a-z]" for i in range(24)))
TOKENIZER_STYLES = ("bytes", "words")


def _words_style(tok: Tokenizer) -> None:
    from tokenizers import Regex, normalizers

    upper = [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    tok.normalizer = normalizers.Sequence([normalizers.Replace(u, CASE_MARK + u.lower()) for u in upper])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(WORD_SPLIT), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    # The byte-level decoder joins all tokens into one string; the replacements then see marks and letters together.
    tok.decoder = decoders.Sequence([decoders.ByteLevel(),
                                     *(decoders.Replace(CASE_MARK + u.lower(), u) for u in upper),
                                     decoders.Replace(CASE_MARK, "")])


def build_tokenizer(texts: Iterable[str], vocab_size: int, style: str = "bytes") -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (GPT-2 style: every byte is in the alphabet, so nothing is ever unknown) on at most
    :data:`TOKENIZER_CORPUS_CHARS` characters, each text cut to :data:`TOKENIZER_TEXT_CHARS`. ``style="words"``
    pre-tokenizes so that a word is the same tokens wherever it stands (:data:`WORD_SPLIT`, :data:`CASE_MARK`)."""
    specials = [PAD, BOS, EOS, *ROLE_TOKENS]
    if vocab_size < 256 + len(specials) + 2:
        raise ValueError(f"vocab size {vocab_size} is too small for a byte-level BPE (need > {256 + len(specials) + 2})")
    if style not in TOKENIZER_STYLES:
        raise ValueError(f"tokenizer style {style!r}: not one of {', '.join(TOKENIZER_STYLES)}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if style == "words":
        _words_style(tok)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 2,  # room for <think> and </think>, added below
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    n_texts = cut = 0
    chars = 0

    def counted() -> Iterator[str]:
        nonlocal n_texts, cut, chars
        for text in texts:
            n_texts += 1
            if len(text) > TOKENIZER_TEXT_CHARS:
                cut += 1
                text = text[:TOKENIZER_TEXT_CHARS]
            chars += len(text)
            yield text
            if chars >= TOKENIZER_CORPUS_CHARS:
                return

    tok.train_from_iterator(counted(), trainer=trainer)
    if n_texts == 0:
        raise DataError("the tokenizer corpus has no text")
    if cut or chars >= TOKENIZER_CORPUS_CHARS:
        log.warning("tokenizer trained on %d texts (%d cut to %d characters%s)", n_texts, cut, TOKENIZER_TEXT_CHARS,
                    f"; stopped at {TOKENIZER_CORPUS_CHARS:,} characters" if chars >= TOKENIZER_CORPUS_CHARS else "")
    # `<s>` starts every encoded prompt, as in Llama; chat prompts get it from the template instead.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, padding_side="left"
    )
    # Reasoning markers are ordinary added tokens: one id each, kept by `decode(skip_special_tokens=True)`.
    fast.add_tokens([THINK, END_THINK])
    fast.chat_template = CHAT_TEMPLATE
    return fast


# -------------------------------------------------------------------------------------------- model


def build_model(preset: str | TinyPreset, tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForCausalLM:
    """A randomly initialised Llama sized by ``preset`` with the tokenizer's vocabulary and special ids."""
    p = PRESETS[preset] if isinstance(preset, str) else preset
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_heads,
        max_position_embeddings=p.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def init_tiny_model(
    preset: str,
    corpus: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    vocab_size: int | None = None,
    seed: int = 0,
) -> LlamaForCausalLM:
    """Train the tokenizer on ``corpus``, build the ``preset`` model, save both into ``out``; return the model."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    out_dir = Path(out)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"{out_dir}: output directory is not empty")
    tokenizer = build_tokenizer(corpus_texts(corpus), vocab_size or PRESETS[preset].vocab_size)
    model = build_model(preset, tokenizer, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("saved %s preset (%.2fM params, vocab %d) to %s", preset, n_params / 1e6, len(tokenizer), out_dir)
    return model
