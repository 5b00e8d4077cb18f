"""Supervised fine-tuning on (prompt, target) pairs with the loss on target tokens only.

One routine serves both SFT jobs of DreamGym: the experience model (target = reasoning + next state + reward,
the paper's joint loss) and the policy's behaviour-cloning warm start (target = the agent's action). The
prompt is encoded exactly as the generation backend encodes it at inference (chat template with the
generation prompt, no extra special tokens), and the target follows it token for token, so what is trained
is what is later generated.

Training runs through ``transformers.Trainer`` (checkpoints, resume, tensorboard, LoRA through peft), so the
same code fine-tunes a 7B model on GPUs.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from dreamgym.llm.base import Prompt

log = logging.getLogger(__name__)
IGNORE_INDEX = -100


@dataclass(frozen=True)
class SFTExample:
    prompt: Prompt
    target: str


class SFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epochs: float = Field(default=3.0, gt=0)
    max_steps: int = Field(default=-1, description="overrides epochs when > 0")
    time_budget_s: float | None = Field(default=None, description="stop (and save) after this many seconds; the "
                                        "summary's time_cap_fired says whether it did (a schedule cut short)")
    learning_rate: float = Field(default=1e-3, gt=0)
    batch_size: int = Field(default=32, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    max_length: int = Field(default=512, ge=16)
    warmup_ratio: float = Field(default=0.03, ge=0, le=1)
    weight_decay: float = 0.0
    lr_scheduler: str = "cosine"
    logging_steps: int = 20
    save_steps: int = 500
    save_total_limit: int | None = Field(default=2, ge=1, description="checkpoints kept (the newest); None: all, "
                                         "e.g. to score a learning curve afterwards")
    seed: int = 0
    num_threads: int | None = Field(default=None, description="torch CPU threads (None: torch's default)")
    lora: bool = Field(default=False, description="train LoRA adapters (peft) instead of all weights")
    lora_r: int = 16
    lora_alpha: int = 32
    lora_target_modules: list[str] | str = "all-linear"
    bf16: bool = False
    group_by_length: bool = Field(default=False, description="batch examples of similar length together "
                                  "(transformers' LengthGroupedSampler): less padding, the same examples per epoch")
    flush_denormal: bool = Field(default=False, description="treat subnormal floats as zero while training on a "
                                 "CPU (torch.set_flush_denormal): the same model, and on the policy's base "
                                 "(pretrained-policy) 0.42 s a step of 16 instead of 0.66 on 2 cores, whose "
                                 "backward pass makes subnormals (benchmarks/results/base_step_speed.json)")

    def after(self, spent_s: float) -> SFTConfig:
        """This config with ``spent_s`` seconds of preparation taken off its time budget (at least 1 s left,
        so a run always trains a step and saves a model): every budget covers every stage."""
        if self.time_budget_s is None:
            return self
        return self.model_copy(update={"time_budget_s": max(1.0, self.time_budget_s - spent_s)})


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids of ``prompt`` exactly as the hf backend encodes it for generation."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt).input_ids)
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def encode_target(tokenizer: Any, target: str) -> list[int]:
    """Token ids of ``target`` + EOS, as SFT trains them."""
    target_ids = list(tokenizer(target, add_special_tokens=False).input_ids)
    if tokenizer.eos_token_id is not None:
        target_ids.append(tokenizer.eos_token_id)
    return target_ids


def prompt_budget(tokenizer: Any, target: str, max_length: int) -> int:
    """How many prompt tokens fit before ``target`` + EOS in ``max_length`` (< 1: the target alone does not)."""
    return max_length - len(encode_target(tokenizer, target))


def tokenize_example(tokenizer: Any, ex: SFTExample, max_length: int) -> dict[str, list[int]] | None:
    """``input_ids`` = prompt + target + EOS, ``labels`` = -100 on the prompt. Over-long prompts are cut from
    the left (the target is never cut; :class:`TokenizedDataset` counts the cuts; experience-model prompts are
    fitted before, by :func:`~dreamgym.experience.protocol.fit_prompt`, and never reach this cut); returns None
    when the target alone does not fit."""
    return _tokenize(tokenizer, ex, max_length)[0]


def _tokenize(tokenizer: Any, ex: SFTExample, max_length: int) -> tuple[dict[str, list[int]] | None, bool]:
    """:func:`tokenize_example` and whether the prompt was cut."""
    prompt_ids = encode_prompt(tokenizer, ex.prompt)
    target_ids = encode_target(tokenizer, ex.target)
    if len(target_ids) >= max_length:
        return None, False
    keep = max_length - len(target_ids)
    cut = len(prompt_ids) > keep
    prompt_ids = prompt_ids[-keep:]
    return {"input_ids": prompt_ids + target_ids, "labels": [IGNORE_INDEX] * len(prompt_ids) + target_ids}, cut


class TokenizedDataset(torch.utils.data.Dataset[dict[str, list[int]]]):
    def __init__(self, tokenizer: Any, examples: Sequence[SFTExample], max_length: int) -> None:
        self.rows: list[dict[str, list[int]]] = []
        self.dropped = 0
        self.cut_prompts = 0  # prompts cut from the left to fit max_length
        seen: dict[int, tuple[dict[str, list[int]] | None, bool]] = {}  # an example repeated (oversampled) by
        for ex in examples:  # reference is tokenized once and its rows share the lists (read-only here)
            if id(ex) not in seen:
                seen[id(ex)] = _tokenize(tokenizer, ex, max_length)
            row, cut = seen[id(ex)]
            if row is None:
                self.dropped += 1
            else:
                self.rows.append(row)
                self.cut_prompts += cut
        if self.dropped:
            log.warning("dropped %d of %d examples whose target is longer than max_length=%d",
                        self.dropped, len(examples), max_length)
        if self.cut_prompts:
            log.warning("cut %d of %d prompts from the left to fit max_length=%d", self.cut_prompts, len(examples),
                        max_length)
        if not self.rows:
            raise ValueError("no training examples left after tokenization (all targets exceed max_length?)")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.rows[i]

    @property
    def target_tokens(self) -> int:
        return sum(sum(1 for x in r["labels"] if x != IGNORE_INDEX) for r in self.rows)


class MaskedCollator:
    """Right-pads a batch; padded positions get attention 0 and label -100."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        n = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), n), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), n), IGNORE_INDEX, dtype=torch.long)
        attn = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            m = len(r["input_ids"])
            ids[i, :m] = torch.tensor(r["input_ids"])
            labels[i, :m] = torch.tensor(r["labels"])
            attn[i, :m] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": attn}


def target_logits_loss(model: Any, inputs: dict[str, torch.Tensor], num_items: Any = None) -> torch.Tensor | None:
    """The causal-LM loss of ``inputs`` with the output head applied to the target positions only (labels != -100),
    or None where ``model`` is not a plain decoder + linear head (a peft wrapper, logit soft-capping or scaling).

    transformers' ``ForCausalLM.forward`` projects every position onto the vocabulary before the loss drops the
    prompt's; in SFT most positions are prompt (an agent prompt of ~400 tokens, a target of ~10), so the head and
    the softmax over the vocabulary are mostly wasted, a large share of a tiny model's step on CPU. The loss is the
    same: the mean over target tokens, or the sum over ``num_items`` (the Trainer's count of target tokens in the
    accumulated batch) when given."""
    cfg = getattr(model, "config", None)
    if cfg is None or any(getattr(cfg, k, None) for k in ("final_logit_softcapping", "logit_scale")) or not hasattr(
            model, "get_decoder") or type(model).__name__ == "PeftModelForCausalLM":
        return None
    head, decoder = model.get_output_embeddings(), model.get_decoder()
    if not isinstance(head, torch.nn.Linear) or decoder is None or decoder is model:
        return None
    hidden = decoder(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask")).last_hidden_state
    labels = inputs["labels"][:, 1:]
    keep = labels != IGNORE_INDEX
    logits = head(hidden[:, :-1][keep]).float()
    loss = torch.nn.functional.cross_entropy(logits, labels[keep], reduction="sum")
    return loss / (num_items if num_items is not None else keep.sum().clamp(min=1))


def _trainer_class() -> Any:
    from transformers import Trainer

    class TargetLogitsTrainer(Trainer):
        """``Trainer`` with :func:`target_logits_loss` for training steps (evaluation keeps the full forward)."""

        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            if not return_outputs and self.label_smoother is None and self.compute_loss_func is None:
                # the Trainer divides by the accumulation steps unless the loss is normalised by num_items_in_batch
                scaled = self.model_accepts_loss_kwargs and num_items_in_batch is not None
                loss = target_logits_loss(model, inputs, num_items_in_batch if scaled else None)
                if loss is not None:
                    return loss
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    return TargetLogitsTrainer


def _time_budget_callback(budget_s: float) -> Any:
    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = time.monotonic()
            self.fired = False

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if time.monotonic() - self.t0 >= budget_s:
                log.warning("time budget of %.0f s reached at step %d: stopping", budget_s, state.global_step)
                self.fired = True
                control.should_training_stop = True
                control.should_save = True
            return control

    return TimeBudget()


def train_sft(
    model: Any,
    tokenizer: Any,
    examples: Sequence[SFTExample],
    out_dir: str | os.PathLike[str],
    cfg: SFTConfig,
    eval_examples: Sequence[SFTExample] | None = None,
    resume: bool = True,
) -> dict[str, Any]:
    """Fine-tune ``model`` on ``examples`` and save it (merged, safetensors) with its tokenizer in ``out_dir``.

    Checkpoints go to ``out_dir/checkpoints`` and a rerun resumes from the newest one; tensorboard logs to
    ``out_dir/checkpoints/runs``. Returns a summary (examples, target tokens, steps, final loss, seconds, and
    ``time_cap_fired``: whether ``cfg.time_budget_s`` stopped it before its epochs / max_steps ended).
    """
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if cfg.flush_denormal and not torch.set_flush_denormal(True):  # process-wide; undone after training
        log.warning("flush_denormal: this CPU cannot flush subnormal floats; training without it")
    try:
        return _train(model, tokenizer, examples, Path(out_dir), cfg, eval_examples, resume)
    finally:
        if cfg.flush_denormal:
            torch.set_flush_denormal(False)


def _train(model: Any, tokenizer: Any, examples: Sequence[SFTExample], out: Path, cfg: SFTConfig,
           eval_examples: Sequence[SFTExample] | None, resume: bool) -> dict[str, Any]:
    from transformers import TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    ckpt_dir = out / "checkpoints"
    train_ds = TokenizedDataset(tokenizer, examples, cfg.max_length)
    eval_ds = TokenizedDataset(tokenizer, eval_examples, cfg.max_length) if eval_examples else None
    if cfg.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                                 target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM"))
    steps_per_epoch = math.ceil(len(train_ds) / (cfg.batch_size * cfg.grad_accum))
    total_steps = cfg.max_steps if cfg.max_steps > 0 else math.ceil(steps_per_epoch * cfg.epochs)
    args = TrainingArguments(
        output_dir=str(ckpt_dir),
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        learning_rate=cfg.learning_rate,
        warmup_steps=int(cfg.warmup_ratio * total_steps),
        weight_decay=cfg.weight_decay,
        lr_scheduler_type=cfg.lr_scheduler,
        logging_steps=cfg.logging_steps,
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        eval_strategy="epoch" if eval_ds is not None else "no",
        report_to=["tensorboard"],
        seed=cfg.seed,
        bf16=cfg.bf16,
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        remove_unused_columns=False,
        train_sampling_strategy="group_by_length" if cfg.group_by_length else "random",
        disable_tqdm=False,
    )
    callbacks = [_time_budget_callback(cfg.time_budget_s)] if cfg.time_budget_s else []
    trainer = _trainer_class()(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        data_collator=MaskedCollator(tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                                     else tokenizer.eos_token_id),
        callbacks=callbacks,
    )
    last = get_last_checkpoint(str(ckpt_dir)) if resume and ckpt_dir.exists() else None
    t0 = time.monotonic()
    result = trainer.train(resume_from_checkpoint=last)
    seconds = time.monotonic() - t0
    final: Any = trainer.model
    if cfg.lora:
        final = final.merge_and_unload()
    final.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {
        "examples": len(train_ds),
        "dropped_examples": train_ds.dropped,
        "cut_prompts": train_ds.cut_prompts,
        "target_tokens": train_ds.target_tokens,
        "steps": trainer.state.global_step,
        "epochs": trainer.state.epoch,
        "train_loss": result.training_loss,
        "seconds": round(seconds, 1),
        "resumed_from": last,
        "time_cap_fired": any(cb.fired for cb in callbacks),
    }
