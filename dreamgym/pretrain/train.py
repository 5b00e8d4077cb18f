"""``dreamgym model pretrain``: a tiny base model pre-trained on the procedural corpus, with its manifest.

The paper starts its experience model and its policy from a pre-trained LLM; a from-scratch tiny model needs
~2 epochs of the shop's data before it copies anything (``benchmarks/results/exp_longer.json``). This job is
meant to give the CPU default that skill beforehand (measured so far: the 1.3M base learns the formats, not yet
copying; :func:`copy_probe` and the README's pre-trained-base section): a byte-level BPE tokenizer (every byte is in its alphabet, so it covers
any env's text; digits and id letters split one per token, :func:`~dreamgym.experience.train.copy_friendly`;
protocol tags single tokens), a tiny Llama, and masked SFT (:func:`~dreamgym.sft.train_sft`: checkpoints,
resume, tensorboard, progress bar) on :func:`~dreamgym.pretrain.corpus.examples`.

Budgets are in tokens (prompt + target), so the same flags give the same model on any machine; the time cap
is a safety limit and the manifest records whether it fired. A rerun of the same command resumes: the corpus
is a function of the seed, the tokenizer is reloaded from the output directory, and the trainer continues
from its last checkpoint.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

from dreamgym.llm.pretrained import MANIFEST, sha256
from dreamgym.sft import MaskedCollator, SFTConfig, SFTExample, encode_prompt, tokenize_example, train_sft

log = logging.getLogger(__name__)

TOKENIZER_EXAMPLES = 4000  # corpus examples the BPE is trained on
# What a base directory ships (the manifest lists the sha256 of each that exists).
BASE_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja")


def _text(ex: SFTExample) -> str:
    prompt = ex.prompt if isinstance(ex.prompt, str) else "\n".join(m["content"] for m in ex.prompt)
    return f"{prompt}\n{ex.target}"


def base_tokenizer(seed: int, vocab_size: int, version: str = "1", style: str = "bytes") -> Any:
    """A byte-level BPE trained on the corpus, with the protocol tags as tokens and copy-friendly splits
    (``style="words"``: :data:`~dreamgym.llm.tiny.WORD_SPLIT`, which has them already)."""
    from dreamgym.experience.protocol import TAG_TEXTS
    from dreamgym.experience.train import copy_friendly
    from dreamgym.llm.tiny import build_tokenizer
    from dreamgym.pretrain.corpus import examples

    # Not training's stream, so the tokenizer is not fitted to the first training batches: version 1 (the
    # shipped base) takes another seed's; later versions another stream of the same seed (the same lexicon).
    stream = examples(seed + 1_000_003) if version == "1" else examples(seed, version, stream="tokenizer")
    texts = (_text(ex) for ex in itertools.islice(stream, TOKENIZER_EXAMPLES))
    tokenizer = build_tokenizer(texts, vocab_size, style)
    tokenizer.add_tokens([t for t in TAG_TEXTS if t not in tokenizer.get_vocab()])
    return tokenizer if style == "words" else copy_friendly(tokenizer)


def corpus_until(tokenizer: Any, seed: int, tokens: int, max_length: int,
                 version: str = "1") -> tuple[list[SFTExample], int]:
    """The first examples of the seed's stream whose tokens (prompt + target, cut to ``max_length``) reach
    ``tokens``; returns them and their token count."""
    from dreamgym.pretrain.corpus import examples

    out: list[SFTExample] = []
    seen = 0
    for ex in examples(seed, version):
        n = len(encode_prompt(tokenizer, ex.prompt)) + len(tokenizer(ex.target, add_special_tokens=False).input_ids) + 1
        seen += min(n, max_length)
        out.append(ex)
        if seen >= tokens:
            break
    return out, seen


INDUCTION_VOCAB = 256  # the warm-up's alphabet: the first ordinary ids (a byte-level BPE's single bytes)


def induction_warmup(model: Any, tokenizer: Any, steps: int, seed: int, batch_size: int = 16,
                     learning_rate: float = 1e-3, length: tuple[int, int] = (16, 48)) -> dict[str, Any]:
    """A procedural warm-up before the corpus: rows of random tokens (the first :data:`INDUCTION_VOCAB` ordinary
    ids, i.e. single bytes: the pieces ids and numbers are spelt in) shown twice, the loss on the second showing,
    which only looking back can predict. Rows vary in length, so no fixed offset answers it: only matching
    content does.

    Small transformers form induction (copy) heads on such rows (Olsson et al. 2022), and procedural pre-training
    has been reported to transfer through attention (Hu et al., arXiv 2502.19249). The corpus mixture alone did not
    form them in a 1.3M model; on these rows a fresh 128x4 reaches 0.94 repeat accuracy in 2,000 steps (~5 min of
    one core). Measured so far, the circuit does not carry into the corpus that follows
    (README, "The pre-trained base"). Seeded, so the same flags give the same model.
    Returns the steps, the final loss and the repeat accuracy on held-out rows."""
    import torch

    specials = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    ordinary = torch.tensor([i for i in range(len(tokenizer)) if i not in specials][:INDUCTION_VOCAB])
    gen = torch.Generator().manual_seed(seed)

    def rows(n: int, g: torch.Generator) -> dict[str, Any]:
        size = int(torch.randint(length[0], length[1] + 1, (1,), generator=g))
        x = ordinary[torch.randint(len(ordinary), (n, size), generator=g)]
        bos = torch.full((n, 1), tokenizer.bos_token_id)
        ids = torch.cat([bos, x, x], dim=1)
        labels = ids.clone()
        labels[:, : size + 1] = -100
        return {"input_ids": ids, "labels": labels}

    held_out = rows(64, torch.Generator().manual_seed(seed + 1))
    loss, _ = _warmup(model, lambda: rows(batch_size, gen), steps, learning_rate, "induction warm-up")
    return {"steps": steps, "batch_size": batch_size, "learning_rate": learning_rate, "length": list(length),
            "final_loss": round(loss, 4), "repeat_accuracy": round(_target_accuracy(model, held_out), 4)}


COPY_SEED_OFFSET = 3_000_017  # the copy warm-up's echo stream: neither a training nor the probe's seed


def copy_warmup(model: Any, tokenizer: Any, steps: int, seed: int, version: str = "4", batch_size: int = 16,
                learning_rate: float = 2e-3, max_length: int = 768, deadline: float | None = None) -> dict[str, Any]:
    """A warm-up in the corpus's own format before the mixture: ``echo`` examples only (an action naming nothing on
    a page of random fields; the page, unchanged, is the target: :func:`~dreamgym.pretrain.corpus.step_echo`),
    masked SFT loss on the target.

    Why: in the mixture, echo is one skill of nine (16% of recipe 4) and a fresh 128x4 copies nothing after 1,928
    steps of it (echo probe 0.60); alone, the same model copies a page after 1,200 steps (held-out echo token
    accuracy 0.95), and the circuit carries into the mixture that follows: a base made this way scores 0.87-0.99 on
    every copy probe where the shipped base scores 0.50-0.62 (README, "A copy-first curriculum"). The random-row
    induction warm-up (:func:`induction_warmup`) teaches the circuit out of the corpus's format, and it did not
    carry. Seeded; returns the steps, the final loss and the held-out echo token accuracy (teacher-forced; the copy
    probe's ``echo`` is the same measure on the probe's set)."""
    report = skill_warmup(model, tokenizer, "echo", steps, seed + COPY_SEED_OFFSET, version, batch_size,
                          learning_rate, max_length, deadline)
    report["echo_accuracy"] = report.pop("target_accuracy")
    return report


MATCH_SEED_OFFSET = 4_000_037  # the match warm-up's stream: neither a training, the copy warm-up's nor the probe's


def match_warmup(model: Any, tokenizer: Any, steps: int, seed: int, version: str = "4", batch_size: int = 16,
                 learning_rate: float = 2e-3, max_length: int = 768, deadline: float | None = None) -> dict[str, Any]:
    """A warm-up on ``match`` examples only (:func:`~dreamgym.pretrain.corpus.match_step`: click the option value
    an item page lists and the task names), after the copy warm-up and before the mixture: the content match the
    shop policy's option choice needs, taught alone as echo taught copying alone. Returns what
    :func:`skill_warmup` does, plus the held-out share of answers predicted whole (teacher-forced) beside the
    majority answer's and those of :func:`~dreamgym.pretrain.corpus.match_baselines` (a random option value, the
    first unselected option) on the same examples."""
    import random

    from dreamgym.pretrain.corpus import RECIPES, example_of, match_baselines

    recipe = RECIPES[version]
    report = skill_warmup(model, tokenizer, "match", steps, seed + MATCH_SEED_OFFSET, version, batch_size,
                          learning_rate, max_length, deadline)
    rng = random.Random(seed + MATCH_SEED_OFFSET + 1)
    held_out = [example_of("match", rng, compact=recipe.compact, words=recipe.agent_words,
                           finished_share=recipe.match_finished) for _ in range(64)]
    report.update(answer_accuracy(model, tokenizer, "match", held_out))
    report.update(match_baselines(held_out))
    return report


def skill_warmup(model: Any, tokenizer: Any, skill: str, steps: int, stream_seed: int, version: str = "4",
                 batch_size: int = 16, learning_rate: float = 2e-3, max_length: int = 768,
                 deadline: float | None = None) -> dict[str, Any]:
    """``steps`` of masked SFT on corpus examples of one ``skill`` (fresh sites, the recipe ``version``'s
    compactness), drawn from ``stream_seed``; returns the steps, the final loss and the held-out target token
    accuracy (teacher-forced, on 32 examples of the next stream)."""
    import random

    from dreamgym.pretrain.corpus import RECIPES, example_of

    recipe = RECIPES[version]

    def batch(rng: random.Random, n: int) -> dict[str, Any]:
        return echo_batch(tokenizer, [example_of(skill, rng, compact=recipe.compact, words=recipe.agent_words,
                                                 finished_share=recipe.match_finished) for _ in range(n)], max_length)

    rng = random.Random(stream_seed)
    held_out = batch(random.Random(stream_seed + 1), 32)
    loss, done = _warmup(model, lambda: batch(rng, batch_size), steps, learning_rate, f"{skill} warm-up", deadline)
    return {"skill": skill, "steps": done, "planned_steps": steps, "time_cap_fired": done < steps,
            "batch_size": batch_size, "learning_rate": learning_rate,
            "corpus_version": version, "final_loss": round(loss, 4),
            "target_accuracy": round(_target_accuracy(model, held_out), 4)}


def echo_batch(tokenizer: Any, examples: Any, max_length: int) -> dict[str, Any]:
    """A padded SFT batch of corpus examples, as the corpus stage trains them (prompt, then target and EOS; labels
    on the target only); an example whose target alone exceeds ``max_length`` is left out (none of recipe 4's
    echo examples comes near 768 tokens)."""
    rows = [row for ex in examples if (row := tokenize_example(tokenizer, ex, max_length)) is not None]
    if not rows:
        raise ValueError(f"warm-up: no example fits max_length={max_length}")
    return MaskedCollator(tokenizer.pad_token_id)(rows)


def _on_model(model: Any, tensors: dict[str, Any]) -> dict[str, Any]:
    """``tensors`` on ``model``'s device (a GPU where the warm-ups or the trainer put it; the CPU otherwise, and for
    a stand-in without one, such as the tests' oracle)."""
    device = getattr(model, "device", "cpu")
    return {k: v.to(device) for k, v in tensors.items()}


def _train_device() -> str:
    """Where the warm-ups train: the GPU when one is visible, as the HF Trainer of the mixture does."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _target_accuracy(model: Any, batch: dict[str, Any]) -> float:
    """Teacher-forced next-token accuracy of ``model`` on ``batch``'s labelled positions."""
    import torch

    model.eval()
    batch = _on_model(model, batch)
    with torch.no_grad():
        pred = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[:, :-1].argmax(-1)
    labels = batch["labels"][:, 1:]
    scored = labels != -100
    return float(((pred == labels) & scored).sum() / scored.sum())


def _warmup(model: Any, next_batch: Any, steps: int, learning_rate: float, name: str,
            deadline: float | None = None) -> tuple[float, int]:
    """The warm-ups' loop over ``next_batch()`` (model inputs with labels), on the GPU when one is visible: AdamW,
    50 linear warm-up steps then a constant rate, clipped gradients, a progress bar; stops early at ``deadline``
    (``time.monotonic()``: the pre-training's time cap, a safety limit). Returns the last loss and the steps run."""
    import torch
    from tqdm.auto import tqdm

    model.to(_train_device())
    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    done = 0
    for step in tqdm(range(1, steps + 1), desc=name, unit="step", mininterval=10):
        if deadline is not None and time.monotonic() >= deadline:
            log.warning("%s: time cap reached at step %d of %d: stopping", name, done, steps)
            break
        for group in opt.param_groups:
            group["lr"] = learning_rate * min(1.0, step / 50)
        loss = model(**_on_model(model, next_batch())).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        done = step
    return float(loss.detach()), done


def _warmup_record(path: Path, run_now: bool, num_threads: int | None, run: Any) -> dict[str, Any] | None:
    """Run a warm-up (``run()``, its report) and record it at ``path`` with its seconds; without ``run_now`` (no
    warm-up asked, or a resume, whose weights come from its checkpoint) the record a first run left, if any."""
    if not run_now:
        return json.loads(path.read_text()) if path.is_file() else None
    if num_threads:
        import torch

        torch.set_num_threads(num_threads)
    t0 = time.monotonic()
    record = run()
    record["seconds"] = round(time.monotonic() - t0, 1)
    path.write_text(json.dumps(record, indent=2) + "\n")
    log.info("%s: %s", path.stem, record)
    return record


PROBE_SEED = 2_000_003  # held-out corpus stream for the copy probe (never a training seed's)
PROBE_PER_SKILL = 16


def copy_probe(model: Any, tokenizer: Any, per_skill: int = PROBE_PER_SKILL) -> dict[str, float]:
    """Teacher-forced accuracy of the target tokens, per corpus skill, on held-out examples of *fresh* sites
    (words never seen in training), so memorising a pool cannot pass it. The shipped base, which predicts no copied
    id or word even teacher-forced, scores 0.45-0.65 on the copy skills (tags, ``[n]`` and element kinds are predictable
    without copying); an oracle scores 1.0, and a model that copies should approach it on ``invalid`` (copy the
    state unchanged), ``open`` (copy the named element into the next page) and ``echo`` (copy a page of random
    fields unchanged: there, nothing but the copy is predictable)."""
    import random

    import torch

    from dreamgym.pretrain.corpus import SKILLS, example_of

    rng = random.Random(PROBE_SEED)
    model.eval()
    out: dict[str, float] = {}
    with torch.no_grad():
        # echo last, so the other skills' held-out examples are those earlier bases were probed on
        for skill in (*SKILLS, "echo"):
            right = total = 0
            for _ in range(per_skill):
                ex = example_of(skill, rng)
                prompt = encode_prompt(tokenizer, ex.prompt)
                target = tokenizer(ex.target, add_special_tokens=False).input_ids
                ids = _on_model(model, {"ids": torch.tensor([prompt + target])})["ids"]
                pred = model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).cpu()
                right += int((pred == torch.tensor(target)).sum())
                total += len(target)
            out[skill] = round(right / total, 4)
    return out


# The spans that decide a comparison: the score of a purchase (``buy``), the chosen option (``choose``, numbered)
# and the named option value (``match``, its click as text).
ANSWER_SPANS = {"buy": ("<reward>", "</reward>"), "choose": ("<action>", "</action>"),
                "match": ("<action>", "</action>")}


def answer_probe(model: Any, tokenizer: Any, per_skill: int = 64) -> dict[str, dict[str, float]]:
    """Whether a base compares, whatever its tokenizer: per comparison skill (:data:`ANSWER_SPANS`), the share of
    held-out fresh-site examples whose whole answer (every token that overlaps the span's characters) is
    predicted right, teacher-forced, beside the majority answer's share (always writing the most common score or
    option number). :func:`copy_probe`'s token accuracy is not comparable across tokenizers (a style that spends
    a token on each space has more easy tokens); this is."""
    import random

    from dreamgym.pretrain.corpus import example_of

    rng = random.Random(PROBE_SEED + 1)  # one stream, skills in order: earlier skills' examples stay as they were
    return {skill: answer_accuracy(model, tokenizer, skill, [example_of(skill, rng) for _ in range(per_skill)])
            for skill in ANSWER_SPANS}


def answer_accuracy(model: Any, tokenizer: Any, skill: str, examples: list[SFTExample]) -> dict[str, float]:
    """The share of ``examples`` of ``skill`` whose whole answer span is predicted right (teacher-forced), beside
    the share of the most common answer (:func:`answer_probe`)."""
    from collections import Counter

    import torch

    open_tag, close_tag = ANSWER_SPANS[skill]
    model.eval()
    right, answers = 0, Counter[str]()
    with torch.no_grad():
        for ex in examples:
            start = ex.target.index(open_tag) + len(open_tag)
            end = ex.target.index(close_tag, start)
            answers[ex.target[start:end]] += 1
            prompt = encode_prompt(tokenizer, ex.prompt)
            enc = tokenizer(ex.target, add_special_tokens=False, return_offsets_mapping=True)
            target = enc.input_ids
            span = [i for i, (a, b) in enumerate(enc.offset_mapping) if a < end and b > start]
            ids = _on_model(model, {"ids": torch.tensor([prompt + target])})["ids"]
            pred = model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).cpu()
            right += all(int(pred[i]) == target[i] for i in span)
    n = len(examples)
    return {"accuracy": round(right / n, 4), "majority": round(answers.most_common(1)[0][1] / n, 4)}


def pretrain_base(
    out_dir: str | os.PathLike[str],
    shape: str = "128x4",
    tokens: int = 20_000_000,
    seed: int = 0,
    vocab_size: int = 2048,
    learning_rate: float = 2e-3,
    batch_size: int = 16,
    warmup_steps: int = 100,
    max_length: int = 768,
    time_cap_s: float | None = None,
    num_threads: int | None = None,
    command: str = "",
    init: str | os.PathLike[str] | None = None,
    corpus_version: str = "1",
    group_by_length: bool = False,
    induction_steps: int = 0,
    tokenizer_style: str = "bytes",
    copy_steps: int = 0,
    match_steps: int = 0,
) -> dict[str, Any]:
    """Pre-train a ``shape`` tiny Llama on ``tokens`` corpus tokens into ``out_dir``; write ``MANIFEST.json``.

    ``init`` continues an existing base (its checked weights and tokenizer; ``shape`` and ``vocab_size`` are
    then its own) instead of a fresh initialisation; the manifest records it and counts its tokens too.
    ``corpus_version`` picks the corpus recipe (:data:`~dreamgym.pretrain.corpus.RECIPES`); ``group_by_length``
    batches examples of similar length (less padding: the same tokens in fewer seconds); ``induction_steps``
    first runs :func:`induction_warmup` for that many steps on a fresh model (not on ``init``, not on a resume);
    ``tokenizer_style`` is :func:`~dreamgym.llm.tiny.build_tokenizer`'s (a fresh tokenizer only); ``copy_steps``
    then runs :func:`copy_warmup` (echo examples of the corpus recipe only) for that many steps, and ``match_steps``
    :func:`match_warmup` after it (neither on a resume).
    Returns the manifest. Rerunning with the same arguments resumes from ``out_dir/checkpoints``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dreamgym.llm.pretrained import read_manifest, resolve_model
    from dreamgym.llm.tiny import TOKENIZER_STYLES, build_model, tiny_shape
    from dreamgym.pretrain.corpus import RECIPES

    if induction_steps and init is not None:
        raise ValueError("--induction-steps warms up a fresh model; it cannot be combined with --init")
    if corpus_version not in RECIPES:
        raise ValueError(f"--corpus-version {corpus_version!r}: not one of {', '.join(RECIPES)}")
    if tokenizer_style not in TOKENIZER_STYLES:
        raise ValueError(f"--tokenizer-style {tokenizer_style!r}: not one of {', '.join(TOKENIZER_STYLES)}")
    if tokenizer_style != "bytes" and init is not None:
        raise ValueError("--tokenizer-style makes a fresh tokenizer; --init keeps its base's, so give one of them")
    preset = tiny_shape(shape)
    if preset is None:
        raise ValueError(f"--preset {shape!r}: not a tiny shape (micro|small|base|<hidden>x<layers>)")
    if tokens < 10_000:
        raise ValueError(f"--tokens {tokens}: too few to train on (at least 10000)")
    init_dir = resolve_model(str(init)) if init is not None else None
    init_manifest = read_manifest(init_dir) if init_dir is not None else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if (out / "tokenizer.json").is_file() and (out / "checkpoints").is_dir():
        tokenizer = AutoTokenizer.from_pretrained(out)  # resuming: the same tokenizer the checkpoints use
    elif init_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(init_dir)
        tokenizer.save_pretrained(out)
    else:
        tokenizer = base_tokenizer(seed, vocab_size, corpus_version, tokenizer_style)
        tokenizer.save_pretrained(out)
    corpus, corpus_tokens = corpus_until(tokenizer, seed, tokens, max_length, corpus_version)
    prep_s = time.monotonic() - t0
    model: Any
    warmup: dict[str, Any] | None = None
    resuming = (out / "checkpoints").is_dir() and any((out / "checkpoints").glob("checkpoint-*"))
    if init_dir is not None:
        model = AutoModelForCausalLM.from_pretrained(init_dir)
    else:
        model = build_model(preset, tokenizer, seed=seed)  # type: ignore[arg-type]  # a fast tokenizer either way
        warmup = _warmup_record(out / "induction_warmup.json", induction_steps > 0 and not resuming, num_threads,
                                lambda: induction_warmup(model, tokenizer, induction_steps, seed))
    deadline = None if time_cap_s is None else t0 + time_cap_s  # the cap covers the warm-ups too
    copy = _warmup_record(out / "copy_warmup.json", copy_steps > 0 and not resuming, num_threads,
                          lambda: copy_warmup(model, tokenizer, copy_steps, seed, corpus_version, batch_size,
                                              max_length=max_length, deadline=deadline))
    match = _warmup_record(out / "match_warmup.json", match_steps > 0 and not resuming, num_threads,
                           lambda: match_warmup(model, tokenizer, match_steps, seed, corpus_version, batch_size,
                                                max_length=max_length, deadline=deadline))
    steps = math.ceil(len(corpus) / batch_size)
    cfg = SFTConfig(epochs=1.0, max_steps=steps, learning_rate=learning_rate, batch_size=batch_size,
                    max_length=max_length, warmup_ratio=min(1.0, warmup_steps / steps), logging_steps=50,
                    save_steps=200, seed=seed, num_threads=num_threads, group_by_length=group_by_length,
                    time_budget_s=time_cap_s).after(time.monotonic() - t0)  # the cap covers every stage before
    log.info("pre-training %s (%.2fM params) on %d examples, %d tokens, %d steps",
             shape, sum(p.numel() for p in model.parameters()) / 1e6, len(corpus), corpus_tokens, steps)
    stats = train_sft(model, tokenizer, corpus, out, cfg)
    done_steps = int(stats["steps"])
    manifest: dict[str, Any] = {
        "command": command,
        "preset": shape,
        "params": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "seed": seed,
        "corpus_version": corpus_version,
        "tokenizer_style": tokenizer_style if init_manifest is None else init_manifest.get("tokenizer_style", "bytes"),
        "corpus_examples": len(corpus),
        "corpus_tokens": corpus_tokens,
        "steps": done_steps,
        "planned_steps": steps,
        # Tokens of the examples the optimiser has consumed (the corpus is used once, in order of a seeded shuffle).
        "tokens_seen": round(corpus_tokens * min(1.0, done_steps / steps))
        + (int(init_manifest["tokens_seen"]) if init_manifest else 0),
        "init": None if init_manifest is None else {
            "path": str(init), "command": init_manifest.get("command"), "corpus_version": init_manifest.get(
                "corpus_version"), "tokens_seen": init_manifest.get("tokens_seen"),
            "model_sha256": init_manifest["files"].get("model.safetensors")},
        "induction_warmup": warmup,
        "copy_warmup": copy,
        "match_warmup": match,
        "copy_probe": copy_probe(model, tokenizer),
        "answer_probe": answer_probe(model, tokenizer),
        "time_cap_fired": done_steps < steps or any(bool(w and w.get("time_cap_fired")) for w in (copy, match)),
        "train_loss": stats["train_loss"],
        "train_seconds": stats["seconds"],
        "prep_seconds": round(prep_s, 1),
        "resumed_from": stats["resumed_from"],
        "sft": cfg.model_dump(),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "torch": _torch_version(), "device": _device()},
    }
    manifest["files"] = {name: sha256(out / name) for name in BASE_FILES if (out / name).is_file()}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
