"""SFT of the experience model M_exp with the paper's joint loss (reasoning + next state + reward/done tokens).

One training example per real transition (:func:`exp_examples`): the prompt is the protocol's context (task,
history window, the top-k neighbours retrieved from a buffer built on the training data but never from the
transition's own trajectory, state, action) and the target is ``<think>R*_t</think>`` + next state + reward +
done/success (:func:`~dreamgym.experience.protocol.step_target`). :func:`~dreamgym.sft.train_sft` puts the
loss on the target tokens only, so

    L = −log P(R*_t | s_t, a_t, H_t, D_k) − log P(s_{t+1}, r_{t+1}, done | s_t, a_t, R*_t, H_t, D_k).

:func:`train_experience_model` trains either a fresh tiny model (a preset of :mod:`dreamgym.llm.tiny`, with a
tokenizer trained on this data where every protocol tag is one token) or any Hugging Face checkpoint (LoRA
through ``SFTConfig.lora`` for big ones): the same code trains the CPU default and a 7B model.

Learning curves: with ``snapshot_every_s`` the run is cut into segments of that many seconds (each resumes
the previous one's checkpoint, so optimiser and schedule continue) and the model after each segment is kept
under ``out_dir/snapshots/<seconds>s``, a loadable experience-model directory for ``dreamgym eval-exp``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dreamgym.experience.annotate import REASONING_KEY, env_of
from dreamgym.experience.model import (
    CONFIG_FILE,
    ExperienceConfig,
    env_hook,
    neighbours_of,
    save_experience_config,
)
from dreamgym.experience.protocol import (
    TAG_TEXTS,
    ExperienceQuery,
    ProtocolConfig,
    build_messages,
    build_prompt_text,
    premise_text,
    prompt_layouts,
    retarget,
    step_target,
)
from dreamgym.experience.reward_head import HEAD_FILE, RewardHead, endings
from dreamgym.sft import SFTConfig, SFTExample, encode_prompt, prompt_budget, train_sft
from dreamgym.software import software
from dreamgym.types import DataError, Trajectory, Transition, read_trajectories

if TYPE_CHECKING:
    from dreamgym.llm.tiny import TinyPreset

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
RETRIEVAL_BATCH = 1024  # queries per encoder call + index search when building the neighbours
# Files of a saved model directory copied into a snapshot (whatever of them exists).
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", CONFIG_FILE, HEAD_FILE)


# ------------------------------------------------------------------------------------------ examples


def require_reasoning(trajs: Sequence[Trajectory]) -> None:
    """Raise :class:`DataError` naming the first trajectory with a step that has no reasoning trace."""
    for traj in trajs:
        for t, x in enumerate(traj.transitions):
            if not isinstance(x.info.get(REASONING_KEY), str):
                raise DataError(
                    f"trajectory {traj.traj_id} step {t} has no info.{REASONING_KEY}: annotate the data first "
                    "(dreamgym annotate --annotator rule) or train without reasoning (--no-reasoning)"
                )


def exp_queries(
    trajs: Sequence[Trajectory], cfg: ProtocolConfig, buffer: Any | None = None
) -> Iterator[tuple[Trajectory, int, ExperienceQuery]]:
    """``(trajectory, t, query)`` for every transition, with neighbours from ``buffer`` when ``cfg.k > 0``.

    Neighbours are retrieved for (s_t, a_t) among transitions of the same env, excluding the trajectory's own
    (a transition must not see its episode's future as an example) and every stored copy of the transition
    itself: the buffer keeps a repeated transition once, under whichever trajectory added it first, so
    excluding the own trajectory alone would let an example retrieve its own target. With
    ``cfg.exact_neighbours`` a transition that another trajectory of ``trajs`` also recorded stays retrievable
    (that trajectory's copy, not the example's own), as the dream finds it for a real task's recorded steps. With
    ``cfg.task_neighbours`` the other episodes of the step's task that took its action come first.
    """
    from dreamgym.replay.record import transition_key

    steps = [(traj, t) for traj in trajs for t in range(len(traj.transitions))]
    keys = {(traj.traj_id, t): transition_key(traj, t) for traj, t in steps}
    shared: set[bytes] = set()
    if cfg.exact_neighbours:
        holders: dict[bytes, set[str]] = {}
        for (traj_id, _), key in keys.items():
            holders.setdefault(key, set()).add(traj_id)
        shared = {key for key, ids in holders.items() if len(ids) > 1}
    for start in range(0, len(steps), RETRIEVAL_BATCH):
        chunk = steps[start : start + RETRIEVAL_BATCH]
        queries = [ExperienceQuery.at_step(traj, t) for traj, t in chunk]
        if buffer is not None and cfg.k > 0 and len(buffer) > 0:
            by_env: dict[str, list[int]] = {}
            for i, (traj, _) in enumerate(chunk):
                by_env.setdefault(env_of(traj), []).append(i)
            for env, rows in by_env.items():
                own = [keys[chunk[i][0].traj_id, chunk[i][1]] for i in rows]
                hits = buffer.retrieve_batch(
                    [(queries[i].state, queries[i].action) for i in rows],
                    cfg.k,
                    env=env,
                    exclude_traj=[chunk[i][0].traj_id for i in rows],
                    exclude_key=[None if key in shared else key for key in own],
                    keep_key=[key if key in shared else None for key in own],
                    same_action_first=cfg.same_action_neighbours,
                    tasks=[queries[i].instruction for i in rows] if cfg.task_neighbours else None,
                )
                for i, h in zip(rows, hits, strict=True):
                    queries[i] = replace(queries[i], retrieved=neighbours_of(h))
        for (traj, t), query in zip(chunk, queries, strict=True):
            yield traj, t, query


def exp_examples(
    trajs: Sequence[Trajectory], protocol_cfg: ProtocolConfig, buffer: Any | None = None, chat: bool = True
) -> list[SFTExample]:
    """One SFT example per real transition: the protocol prompt and the target M_exp must write.

    With ``protocol_cfg.reasoning`` every step needs ``info["reasoning"]`` (a :class:`DataError` names the first
    trajectory without it). ``buffer`` (a :class:`~dreamgym.replay.ReplayBuffer`) supplies the top-k neighbours.
    """
    return [ex for _, ex in exp_pairs(trajs, protocol_cfg, buffer, chat)]


def exp_pairs(
    trajs: Sequence[Trajectory], protocol_cfg: ProtocolConfig, buffer: Any | None = None, chat: bool = True
) -> list[tuple[ExperienceQuery, SFTExample]]:
    """:func:`exp_examples` with the query each example's prompt was built from (for :func:`fit_examples`)."""
    if protocol_cfg.reasoning:
        require_reasoning(trajs)
    pairs = []
    for traj, t, query in exp_queries(trajs, protocol_cfg, buffer):
        reasoning = traj.transitions[t].info.get(REASONING_KEY) if protocol_cfg.reasoning else None
        prompt = build_messages(query, protocol_cfg) if chat else build_prompt_text(query, protocol_cfg)
        try:
            target = step_target(traj, t, reasoning, protocol_cfg, query)
        except ValueError as e:
            raise DataError(f"trajectory {traj.traj_id} step {t}: {e}") from None
        pairs.append((query, SFTExample(prompt, target)))
    return pairs


def check_premises(pairs: Sequence[tuple[ExperienceQuery, SFTExample]], protocol_cfg: ProtocolConfig,
                   env: str | None) -> int:
    """How many examples ``computed_premises`` would start from the env's premise (0 without the option). Raises
    :class:`DataError` when a target does not start as its premise does (its traces were annotated without the
    options the premises assume, e.g. TextWorld's ``annotator_options: {recipe: true}``): served that way, the
    model would be handed openings it never wrote."""
    if not protocol_cfg.computed_premises:
        return 0
    premise = env_hook(env, "computed_premises", "trace_premise")
    premised, wrong = 0, []
    for query, ex in pairs:
        p = premise(query.instruction, query.state, query.action)
        if p is None:
            continue
        premised += 1
        if not ex.target.startswith(premise_text(p, query, protocol_cfg)):
            wrong.append(query.action)
    if wrong:
        raise DataError(f"{len(wrong)} of {premised} targets do not start with {env}'s computed premise (the first "
                        f"for action {wrong[0]!r}): were the traces annotated with the options it assumes?")
    return premised


def fit_examples(
    tokenizer: Any, pairs: Sequence[tuple[ExperienceQuery, SFTExample]], protocol_cfg: ProtocolConfig, chat: bool,
    max_length: int, served_budget: int | None = None,
) -> tuple[list[SFTExample], dict[str, int]]:
    """The examples with each prompt fitted to ``max_length`` minus its target's tokens (to ``served_budget`` when
    that is less and some layout fits it: the budget a served prompt gets, ``ExperienceConfig.prompt_budget``, so
    that M_exp is served the layouts it was trained on) by the rule inference shortens prompts by
    (:func:`~dreamgym.experience.protocol.prompt_layouts`: neighbours first, then history, oldest first, then state
    lines; never the system text or the TASK line), instead of SFT's cut from the left. With ``copy_refs`` and
    ``layout_refs`` a shortened prompt's target points only at what that prompt shows
    (:func:`~dreamgym.experience.protocol.retarget`), so its length depends on the layout: the first layout whose
    prompt and target fit is taken. Returns the examples and the counts: ``shortened_prompts`` (examples trained
    on a shortened prompt), ``retargeted`` (of these, targets that write out what a reference pointed at) and
    ``unfit_prompts`` (examples left out because not even the shortest prompt fits; inference serves such a step
    the failure state). Examples whose target alone exceeds ``max_length`` are kept for SFT to drop and count.
    """
    def count(p: Any) -> int:
        return len(encode_prompt(tokenizer, p))

    def fit(query: ExperienceQuery, ex: SFTExample) -> tuple[SFTExample | None, bool, bool]:
        if prompt_budget(tokenizer, ex.target, max_length) < 1:
            return ex, False, False
        def target_of(layout: ProtocolConfig) -> tuple[str, int]:  # the layout's target and the prompt room it leaves
            target = retarget(ex.target, query, protocol_cfg, layout)
            if target is None:
                raise DataError(f"M_exp target does not parse against its own prompt: {ex.target[:80]!r}")
            return target, prompt_budget(tokenizer, target, max_length)

        candidates = []  # (layout, prompt, its tokens), in prompt_layouts' order
        for layout in prompt_layouts(query, protocol_cfg):
            prompt = build_messages(query, layout) if chat else build_prompt_text(query, layout)
            n = count(prompt)
            candidates.append((layout, prompt, n))
            if served_budget is None or n <= served_budget:  # a target is re-encoded only for a prompt that fits
                target, budget = target_of(layout)
                if n <= budget:
                    return SFTExample(prompt, target), layout is not protocol_cfg, target != ex.target
        if served_budget is not None:  # no layout within the served budget: the example's own budget
            for layout, prompt, n in candidates:
                if n <= served_budget:  # tried above: its target did not leave it room
                    continue
                target, budget = target_of(layout)
                if n <= budget:
                    return SFTExample(prompt, target), layout is not protocol_cfg, target != ex.target
        return None, True, False

    cache: dict[int, tuple[SFTExample | None, bool, bool]] = {}  # mix() repeats example objects: fit each once
    out: list[SFTExample] = []
    counts = {"shortened_prompts": 0, "retargeted": 0, "unfit_prompts": 0}
    for query, ex in pairs:
        if id(ex) not in cache:
            cache[id(ex)] = fit(query, ex)
        fitted, shortened, retargeted = cache[id(ex)]
        if fitted is None:
            counts["unfit_prompts"] += 1
            continue
        counts["shortened_prompts"] += shortened
        counts["retargeted"] += retargeted
        out.append(fitted)
    if counts["shortened_prompts"] or counts["unfit_prompts"]:
        log.warning("M_exp SFT: %d of %d prompts shortened to fit max_length=%d (%d targets written out further), %d "
                    "left out (too long even shortened)", counts["shortened_prompts"], len(pairs), max_length,
                    counts["retargeted"], counts["unfit_prompts"])
    return out, counts


def read_training_data(paths: Sequence[str | os.PathLike[str]]) -> list[Trajectory]:
    """All trajectories with at least one transition from ``paths`` (a file that has none is an error)."""
    trajs: list[Trajectory] = []
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such trajectory file")
        got = [t for t in read_trajectories(path) if t.transitions]
        if not got:
            raise DataError(f"{path}: no trajectory with transitions")
        trajs += got
    return trajs


def mix(
    examples: Sequence[SFTExample], kinds: Sequence[str], weights: dict[str, float], seed: int = 0
) -> list[SFTExample]:
    """Resample ``examples`` by kind: weight w keeps floor(w) copies plus one more with probability w − floor(w).
    A kind ``page:outcome`` (:func:`step_kinds`' terminal steps) takes its own weight, else its page's; other kinds
    keep 1. Spends the training budget where it teaches most (see the README)."""
    if any(w < 0 for w in weights.values()):
        raise ValueError(f"mixture weights must be >= 0, got {weights}")
    rng = random.Random(seed)
    out: list[SFTExample] = []
    for ex, kind in zip(examples, kinds, strict=True):
        w = weights.get(kind, weights.get(kind.split(":", 1)[0], 1.0))
        out += [ex] * (int(w) + (rng.random() < w - int(w)))
    if not out:
        raise ValueError(f"the mixture {weights} leaves no training example")
    return out


def step_kinds(trajs: Sequence[Trajectory]) -> list[str]:
    """The kind of each transition (in :func:`exp_examples` order): the page type of its real next state, and on a
    terminal step its outcome too (``done:success`` / ``done:failure``, by ``info["success"]`` or reward >= 1), so a
    mixture can weigh the rare failed endings apart from the common successes."""
    from dreamgym.envs.base import page_type_of
    from dreamgym.experience.annotate import env_of

    def kind(page: str, x: Transition) -> str:
        if not x.done:
            return page
        won = x.info["success"] if isinstance(x.info.get("success"), bool) else x.reward >= 1.0
        return f"{page}:{'success' if won else 'failure'}"

    return [kind(page_type_of(env_of(traj))(x.next_state), x) for traj in trajs for x in traj.transitions]


# ------------------------------------------------------------------------------------------ model


def tokenizer_corpus(trajs: Sequence[Trajectory], examples: Sequence[SFTExample]) -> Iterator[str]:
    """Text a fresh tokenizer is trained on: instructions, states, actions, reasoning, and the prompt scaffold."""
    for traj in trajs:
        yield traj.task.instruction
        for x in traj.transitions:
            yield x.state
            yield x.action
            yield x.next_state
            if isinstance(x.info.get(REASONING_KEY), str):
                yield x.info[REASONING_KEY]
    for ex in examples[:200]:  # section headers, the system text, the target scaffold
        yield ex.prompt if isinstance(ex.prompt, str) else "\n".join(m["content"] for m in ex.prompt)
        yield ex.target


# Pre-tokenization for copying: every digit is its own token (a price is copied and compared digit by digit,
# the same way wherever it appears) and so is every letter of an identifier that contains a digit (a product
# id "B0QH9VSU" and the click "b0qh9vsu" become the same letters in two cases, which a small model can match;
# BPE would cut them into unrelated pieces). Lookbehind must be fixed-width, hence one alternative per length.
_ID_LETTER_AFTER_DIGIT = "|".join(f"(?<=[0-9][A-Za-z]{{{i}}})[A-Za-z]" for i in range(12))
COPY_FRIENDLY_SPLIT = rf"[0-9]|[A-Za-z](?=[A-Za-z0-9]*[0-9])|{_ID_LETTER_AFTER_DIGIT}"


def copy_friendly(tokenizer: Any) -> Any:
    """Put :data:`COPY_FRIENDLY_SPLIT` in front of the byte-level pre-tokenizer of a tiny BPE tokenizer.

    Applied after BPE training (``tiny.build_tokenizer`` has no pre-tokenizer option): merges across the new
    boundaries are simply never used, so nothing is lost but a few unused vocabulary entries.
    """
    from tokenizers import Regex, pre_tokenizers

    backend = tokenizer.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(COPY_FRIENDLY_SPLIT), "isolated"), backend.pre_tokenizer]
    )
    return tokenizer


def fresh_tiny_model(
    preset: str | TinyPreset, trajs: Sequence[Trajectory], examples: Sequence[SFTExample], vocab_size: int | None,
    seed: int,
) -> tuple[Any, Any]:
    """A tokenizer trained on the data (protocol tags as single tokens, :func:`copy_friendly` splits) and a
    randomly initialised tiny Llama of ``preset``."""
    from dreamgym.llm.tiny import PRESETS, build_model, build_tokenizer

    shape = PRESETS[preset] if isinstance(preset, str) else preset
    tokenizer = build_tokenizer(tokenizer_corpus(trajs, examples), vocab_size or shape.vocab_size)
    tokenizer.add_tokens([t for t in TAG_TEXTS if t not in tokenizer.get_vocab()])
    copy_friendly(tokenizer)
    return build_model(shape, tokenizer, seed=seed), tokenizer


def load_pretrained(path: str) -> tuple[Any, Any]:
    """A Hugging Face causal LM and its tokenizer (local directory, hub name, or ``pretrained``: the shipped base)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dreamgym.llm.pretrained import resolve_model

    path = resolve_model(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return AutoModelForCausalLM.from_pretrained(path), tokenizer


def target_token_limit(lengths: Sequence[int], margin: float = 1.25) -> int:
    """``max_new_tokens`` for inference: the longest training target (``lengths`` in tokens) with a margin."""
    return max(16, math.ceil(max(lengths) * margin) + 1)


def target_token_counts(tokenizer: Any, examples: Sequence[SFTExample]) -> dict[str, int]:
    """Each distinct target's length in tokens (no end token), tokenized once (``mix`` repeats examples)."""
    return {t: len(tokenizer(t, add_special_tokens=False).input_ids) for t in {ex.target for ex in examples}}


def served_prompt_budget(lengths: Sequence[int], max_length: int, context: int, q: float = 0.99) -> int:
    """``ExperienceConfig.prompt_budget`` for targets of ``lengths`` tokens (+1 each for the end token): the budget
    SFT fits a median example's prompt to (``max_length`` minus its target), at most what leaves the ``q`` quantile
    of the targets room to be written in the model's ``context``, and at least half of ``max_length`` (long answers,
    as TextWorld's, do not take the prompt's half). Served prompts are fitted to it, and SFT fits none longer
    (:func:`fit_examples`), so M_exp is served the layouts it was trained on while most answers fit."""
    ordered = sorted(n + 1 for n in lengths)
    median, high = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]
    return max(max_length // 2, min(max_length - median, context - high))


# ------------------------------------------------------------------------------------------ training


def _snapshot(out_dir: Path, seconds: float) -> Path:
    """Copy the model directory's files into ``out_dir/snapshots/<seconds>s``."""
    dest = out_dir / "snapshots" / f"{round(seconds):05d}s"
    dest.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        if (out_dir / name).exists():
            shutil.copy2(out_dir / name, dest / name)
    return dest


def train_experience_model(
    data_paths: Sequence[str | os.PathLike[str]],
    model: str,
    out_dir: str | os.PathLike[str],
    protocol_cfg: ProtocolConfig,
    sft_cfg: SFTConfig,
    buffer_dir: str | os.PathLike[str] | None = None,
    encoder: Literal["hashing", "minilm"] | str = "hashing",
    chat: bool = True,
    vocab_size: int | None = None,
    mixture: dict[str, float] | None = None,
    snapshot_every_s: float | None = None,
    seed: int = 0,
    reward_head: bool = False,
    reserve_prompt: bool = True,
) -> dict[str, Any]:
    """Train M_exp on annotated real trajectories; save model, tokenizer, ``experience.json``, ``summary.json``.

    ``model``: a tiny shape (:func:`tiny_shape`: ``micro``/``small``/``base`` or ``<hidden>x<layers>``) for a
    fresh model, else a path / hub name of a Hugging Face checkpoint. With ``protocol_cfg.k > 0`` the training
    trajectories are added to the replay buffer at ``buffer_dir`` (default ``out_dir/buffer``), which serves
    the neighbours. ``mixture`` resamples the examples by the page type of their next state (:func:`mix`).
    ``reward_head`` also fits :class:`~dreamgym.experience.reward_head.RewardHead` on the data's real endings and
    saves it beside the model (each snapshot too), with ``experience.json`` saying to use it.
    ``reserve_prompt`` fits served prompts to ``prompt_budget`` (:func:`served_prompt_budget`, written to
    ``experience.json``) and SFT's to no more than that; False: the rule before 2026-12-06 (SFT fits a prompt to
    ``max_length`` minus its own target; serving, to the context minus ``max_new_tokens``).
    Returns the summary (examples, tokens, epochs, seconds, loss, and the snapshots taken).
    """
    from dreamgym.llm.tiny import tiny_shape

    out = Path(out_dir)
    trajs = read_training_data(data_paths)
    if protocol_cfg.reasoning:
        require_reasoning(trajs)  # before a buffer or a tokenizer is built
    shape = tiny_shape(model)
    t0 = time.monotonic()
    buffer = None
    buffer_path = Path(buffer_dir) if buffer_dir else out / "buffer"
    # The run's own buffer is built under another name and renamed when complete, so a kill never leaves a
    # half-built one behind (the next attempt starts it afresh); a buffer given by --buffer is grown in place.
    building = protocol_cfg.k > 0 and buffer_dir is None and not buffer_path.exists()
    partial = buffer_path.with_name(buffer_path.name + ".partial")
    if protocol_cfg.k > 0:
        from dreamgym.replay import ReplayBuffer
        from dreamgym.replay.encoder import make_encoder

        if building:
            shutil.rmtree(partial, ignore_errors=True)
        buffer = ReplayBuffer.open(partial if building else buffer_path, make_encoder(encoder))
        buffer.add_trajectories(trajs)
    try:
        pairs = exp_pairs(trajs, protocol_cfg, buffer, chat=chat)
    finally:
        if buffer is not None:
            buffer.close()
    if building:
        os.replace(partial, buffer_path)
    envs = {t.task.env for t in trajs}
    env = next(iter(envs)) if len(envs) == 1 else None
    premised = check_premises(pairs, protocol_cfg, env)
    examples = [ex for _, ex in pairs]
    query_of = {id(ex): query for query, ex in pairs}
    transitions = len(examples)
    if mixture:
        examples = mix(examples, step_kinds(trajs), mixture, seed)
    random.Random(seed).shuffle(examples)
    if shape is not None:
        lm, tokenizer = fresh_tiny_model(shape, trajs, examples, vocab_size, seed)
    else:
        lm, tokenizer = load_pretrained(model)
    # The time budget covers every stage: what the buffer, the examples and the tokenizer took comes off the
    # training's share (at least a second, so a run always trains a step and saves a model).
    target_tokens_of = target_token_counts(tokenizer, examples)
    context = getattr(lm.config, "max_position_embeddings", None) or sft_cfg.max_length
    served = (served_prompt_budget([target_tokens_of[ex.target] for ex in examples], sft_cfg.max_length, context)
              if reserve_prompt else None)
    examples, fitting = fit_examples(tokenizer, [(query_of[id(ex)], ex) for ex in examples], protocol_cfg, chat,
                                     sft_cfg.max_length, served)
    if not examples:
        raise DataError(f"no training prompt fits max_length={sft_cfg.max_length} tokens, even shortened "
                        "(raise --max-length)")
    prep_s = time.monotonic() - t0
    sft_cfg = sft_cfg.after(prep_s)
    prompt_tokens = sum(len(encode_prompt(tokenizer, ex.prompt)) for ex in examples)
    # a shortened prompt's target may be written out further (layout_refs): count those too
    target_tokens_of.update(target_token_counts(tokenizer, [ex for ex in examples if ex.target not in target_tokens_of]))
    lengths = [target_tokens_of[ex.target] for ex in examples]
    target_tokens = sum(lengths)
    exp_cfg = ExperienceConfig.from_protocol(protocol_cfg, chat=chat, env=env,
                                             max_new_tokens=target_token_limit(lengths),
                                             prompt_budget=served,
                                             reward_head=reward_head)
    head = RewardHead.fit(endings(trajs), seed=seed) if reward_head else None
    if head is not None:  # saved once, before the first snapshot copies the model dir's files
        out.mkdir(parents=True, exist_ok=True)
        head.save(out)
    n_params = sum(p.numel() for p in lm.parameters())
    log.info("M_exp: %d examples (%d transitions), %.1f prompt + %.1f target tokens each, %.2fM params",
             len(examples), transitions, prompt_tokens / len(examples), target_tokens / len(examples), n_params / 1e6)

    snapshots: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for budget in _segments(sft_cfg, snapshot_every_s):
        runs.append(train_sft(lm, tokenizer, examples, out, sft_cfg.model_copy(update={"time_budget_s": budget})))
        save_experience_config(out, exp_cfg)
        if snapshot_every_s:
            train_s = sum(r["seconds"] for r in runs)
            snapshots.append({"seconds": round(train_s, 1), "epochs": runs[-1]["epochs"],
                              "train_loss": runs[-1]["train_loss"], "dir": str(_snapshot(out, train_s))})
        if runs[-1]["epochs"] >= sft_cfg.epochs - 1e-6 or 0 < sft_cfg.max_steps <= runs[-1]["steps"]:
            break  # the schedule ended before the time budget did
    last = runs[-1]
    summary = {
        "model": model,
        "params": n_params,
        "trajectories": len(trajs),
        "transitions": transitions,
        "examples": last["examples"],
        "dropped_examples": last["dropped_examples"],
        "shortened_prompts": fitting["shortened_prompts"],
        "retargeted": fitting["retargeted"],
        "unfit_prompts": fitting["unfit_prompts"],
        "cut_prompts": last["cut_prompts"],
        "prompt_tokens": prompt_tokens,
        "target_tokens": target_tokens,
        "steps": last["steps"],
        "epochs": last["epochs"],
        "train_loss": last["train_loss"],
        "seconds": round(sum(r["seconds"] for r in runs), 1),
        # the last call stopped on time (earlier snapshot segments stop on time by design): the schedule was cut
        "time_cap_fired": last["time_cap_fired"],
        "prep_seconds": round(prep_s, 1),
        "protocol": protocol_cfg.model_dump(),
        "sft": sft_cfg.model_dump(),
        "chat": chat,
        "encoder": encoder if protocol_cfg.k > 0 else None,
        "mixture": mixture,
        "max_new_tokens": exp_cfg.max_new_tokens,
        "prompt_budget": exp_cfg.prompt_budget,
        "snapshots": snapshots,
        "data": [str(p) for p in data_paths],
        "reward_head": head.summary if head is not None else None,
        "premised_transitions": premised,
        "software": software(),
    }
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
    return summary


class ExpTrainConfig(BaseModel):
    """Everything ``dreamgym train-exp`` needs besides the data and the output (a YAML file of these fields)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(default="small", description="tiny shape (micro|small|base|<hidden>x<layers>) or HF path")
    protocol: dict[str, Any] = Field(default_factory=dict, description="ProtocolConfig fields")
    sft: dict[str, Any] = Field(default_factory=dict, description="SFTConfig fields")
    mixture: dict[str, float] | None = Field(default=None, description="examples per transition by page type")
    encoder: str = "hashing"
    chat: bool = True
    vocab_size: int | None = None
    snapshot_every_s: float | None = None
    seed: int = 0
    reward_head: bool = Field(default=False, description="fit a reward head for the steps M_exp ends "
                              "(dreamgym.experience.reward_head)")
    reserve_prompt: bool = Field(default=True, description="serve prompts fitted to the budget SFT fitted them to "
                                 "(ExperienceConfig.prompt_budget); false: the rule before 2026-12-06")

    def protocol_config(self) -> ProtocolConfig:
        return ProtocolConfig(**self.protocol)

    def sft_config(self) -> SFTConfig:
        return SFTConfig(**self.sft)


def _segments(cfg: SFTConfig, every_s: float | None) -> list[float | None]:
    """Time budgets of the training calls: one call, or ``every_s`` slices of ``cfg.time_budget_s``."""
    if not every_s:
        return [cfg.time_budget_s]
    if every_s <= 0:
        raise ValueError(f"snapshot_every_s must be > 0, got {every_s}")
    if cfg.time_budget_s is None:
        raise ValueError("snapshots need a time budget (--time-budget) to cut it into segments")
    n = max(1, math.ceil(cfg.time_budget_s / every_s - 1e-9))
    return [min(every_s, cfg.time_budget_s - i * every_s) for i in range(n)]
