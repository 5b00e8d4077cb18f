"""The DPO baseline: preference pairs of a successful vs a failed step from offline data, trained with TRL.

Pairing rule (:func:`preference_pairs`). Trajectories are grouped by task. Each failed trajectory F is paired
with the successful trajectory S of the same task that shares the longest action prefix with it (the first
such S in file order on ties). At the first step t where their actions differ, F and S have taken the same
actions from the same task, so the agent saw the same history and (up to env randomness that does not depend
on the actions, e.g. the shop's example queries) the same state. The pair is

    prompt   = F's agent prompt at step t (its state, admissible actions and action history)
    chosen   = <action>S's action at t</action>
    rejected = <action>F's action at t</action>

i.e. the first point where the failure departed from a success. Failed trajectories whose task has no
success in the data give no pair (so the data needs several episodes per task: collect more episodes than the
split has tasks, or several noisy seeds); identical pairs are kept once.

Training is TRL's ``DPOTrainer`` (loss −log σ(β[(log π_c − log π_ref,c) − (log π_r − log π_ref,r)])) from a
behaviour-cloning run dir, with a frozen copy of that policy as the reference.

Long pairs. TRL's ``max_length`` bounds prompt + completion, and TRL (1.x; there is no separate prompt limit)
truncates with ``truncation_mode="keep_start"``: the sequence is cut at the right, so a long pair loses the end
of its completion (the closing ``</action>`` and EOS), never its prompt; a pair whose prompt alone fills
``max_length`` would keep no completion token, and ``DPOTrainer`` silently filters it out of the dataset.
:func:`check_pair_lengths` tokenizes the pairs as TRL does (chat template, completion after the common prefix)
and counts both cases: pairs whose prompt alone is too long are left out here, visibly; pairs whose completion
is cut are trained as TRL cuts them. Both counts are logged and reported in the summary
(``pairs_prompt_too_long``, ``pairs_completion_cut``, with ``trained_pairs``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from dreamgym.agent.policy import PolicyConfig, action_target, build_agent_prompt, save_policy
from dreamgym.baselines.sft import agent_observations, read_data
from dreamgym.llm.base import ChatMessages
from dreamgym.rl.losses import token_logprobs
from dreamgym.sft import MaskedCollator, SFTExample, tokenize_example
from dreamgym.types import DataError, Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreferencePair:
    prompt: ChatMessages
    chosen: str  # the completion to prefer: <action>…</action>
    rejected: str
    task_id: str
    step: int


class DPOTrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    beta: float = Field(default=0.1, gt=0, description="strength of the pull towards the reference policy")
    epochs: float = Field(default=3.0, gt=0)
    learning_rate: float = Field(default=1e-4, gt=0)
    batch_size: int = Field(default=16, ge=1)
    max_length: int = Field(default=1024, ge=16, description="prompt + completion tokens (TRL keeps the start: a "
                            "longer completion is cut; a pair whose prompt alone fills it is left out; both counted)")
    logging_steps: int = Field(default=10, ge=1)
    seed: int = 0
    num_threads: int | None = Field(default=None, description="torch CPU threads (None: torch's default)")


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def preference_pairs(trajs: Sequence[Trajectory], policy_cfg: PolicyConfig) -> list[PreferencePair]:
    """Success-vs-failure step pairs by the rule in the module docstring."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for traj in trajs:
        by_task[traj.task.task_id].append(traj)
    pairs: list[PreferencePair] = []
    seen: set[str] = set()
    unpaired = 0
    for task_id, group in by_task.items():
        successes = [[x.action for x in t.transitions] for t in group if t.success]
        for failed in (t for t in group if not t.success):
            actions = [x.action for x in failed.transitions]
            if not successes or not actions:
                unpaired += 1
                continue
            best = max(successes, key=lambda s: _common_prefix(s, actions))  # max keeps the first on ties
            t = _common_prefix(best, actions)
            if t == len(actions) or t == len(best):  # one is a prefix of the other: no differing step
                continue
            obs = agent_observations(failed)[t]
            pair = PreferencePair(build_agent_prompt(obs, policy_cfg), action_target(obs, best[t], policy_cfg),
                                  action_target(obs, actions[t], policy_cfg), task_id, t)
            key = json.dumps([pair.prompt, pair.chosen, pair.rejected])
            if key not in seen:
                seen.add(key)
                pairs.append(pair)
    if unpaired:
        log.info("preference pairs: %d failed trajectories have no success of their task to pair with", unpaired)
    return pairs


def _chat_ids(tokenizer: Any, messages: ChatMessages, add_generation_prompt: bool = False) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                        add_generation_prompt=add_generation_prompt)
    return list(out["input_ids"])


def pair_lengths(tokenizer: Any, pair: PreferencePair) -> tuple[int, int, int]:
    """(prompt, chosen, rejected) token counts of a pair as TRL's ``DPOTrainer`` tokenizes it: the chat template
    over the prompt (with the generation prompt) and over prompt + each completion; the completions start where
    those diverge."""
    prompt = _chat_ids(tokenizer, pair.prompt, add_generation_prompt=True)
    chosen = _chat_ids(tokenizer, [*pair.prompt, {"role": "assistant", "content": pair.chosen}])
    rejected = _chat_ids(tokenizer, [*pair.prompt, {"role": "assistant", "content": pair.rejected}])
    n = min(_common_prefix(prompt, chosen), _common_prefix(prompt, rejected))
    return n, len(chosen) - n, len(rejected) - n


def check_pair_lengths(
    tokenizer: Any, pairs: Sequence[PreferencePair], max_length: int
) -> tuple[list[PreferencePair], dict[str, int]]:
    """The pairs TRL can train within ``max_length`` and the counts of the long ones (module docstring): pairs
    whose prompt alone has ``max_length`` tokens or more are left out (``prompt_too_long``); pairs kept whose
    prompt + longer completion exceeds it have their completion cut by TRL (``completion_cut``). Logged."""
    kept: list[PreferencePair] = []
    counts = {"prompt_too_long": 0, "completion_cut": 0}
    for pair in pairs:
        prompt, chosen, rejected = pair_lengths(tokenizer, pair)
        if prompt >= max_length:
            counts["prompt_too_long"] += 1
            continue
        counts["completion_cut"] += prompt + max(chosen, rejected) > max_length
        kept.append(pair)
    if counts["prompt_too_long"]:
        log.warning("DPO: %d of %d pairs left out: the prompt alone has max_length=%d tokens or more",
                    counts["prompt_too_long"], len(pairs), max_length)
    if counts["completion_cut"]:
        log.warning("DPO: %d of %d pairs are longer than max_length=%d: TRL cuts the end of their completion",
                    counts["completion_cut"], len(pairs), max_length)
    return kept, counts


# ------------------------------------------------------------------------------------------ metrics


@torch.no_grad()
def target_logprobs(model: Any, tokenizer: Any, examples: Sequence[SFTExample], batch_size: int = 32) -> list[float]:
    """log π(target + EOS | prompt) of each example, tokenised exactly as SFT trains and the policy acts."""
    rows = []
    for ex in examples:
        row = tokenize_example(tokenizer, ex, max_length=1 << 30)
        if row is None:  # cannot happen without a length limit; kept for the type checker
            raise ValueError("an example could not be tokenised")
        rows.append(row)
    collate = MaskedCollator(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    was_training = model.training
    model.eval()
    out: list[float] = []
    for start in range(0, len(rows), batch_size):
        batch = collate(rows[start : start + batch_size])
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        # logits at t predict the token at t + 1; labels are -100 (→ 0) outside the target.
        out.extend(token_logprobs(logits[:, :-1], batch["labels"][:, 1:]).sum(-1).tolist())
    model.train(was_training)
    return out


def preference_margin(model: Any, tokenizer: Any, pairs: Sequence[PreferencePair]) -> float:
    """Mean over pairs of log π(chosen | prompt) − log π(rejected | prompt)."""
    chosen = target_logprobs(model, tokenizer, [SFTExample(p.prompt, p.chosen) for p in pairs])
    rejected = target_logprobs(model, tokenizer, [SFTExample(p.prompt, p.rejected) for p in pairs])
    return sum(c - r for c, r in zip(chosen, rejected, strict=True)) / max(len(pairs), 1)


# ----------------------------------------------------------------------------------------- training


def train_dpo(
    data_paths: Sequence[str | os.PathLike[str]],
    init_run_dir: str | os.PathLike[str],
    out_run_dir: str | os.PathLike[str],
    cfg: DPOTrainConfig,
) -> dict[str, Any]:
    """DPO from the policy run dir ``init_run_dir`` (its PolicyConfig builds the prompts) into a new policy run
    dir; returns the summary (also in ``out_run_dir/summary.json``) with the margin before and after. A rerun
    into the same dir resumes from its last checkpoint."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_utils import get_last_checkpoint
    from trl import DPOConfig, DPOTrainer

    init, run = Path(init_run_dir), Path(out_run_dir)
    if not (init / "model").is_dir() or not (init / "policy.json").is_file():
        raise FileNotFoundError(f"{init}: not a policy run dir (needs model/ and policy.json)")
    if (run / "summary.json").exists():
        raise ValueError(f"{run}: already holds a finished run (summary.json); choose another --out")
    policy_cfg = PolicyConfig.model_validate_json((init / "policy.json").read_text())
    trajs = read_data(data_paths)
    pairs = preference_pairs(trajs, policy_cfg)
    if not pairs:
        raise DataError(f"{', '.join(map(str, data_paths))}: no preference pairs: no task has both a successful "
                        "and a failed trajectory (collect several episodes per task)")
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    tokenizer = AutoTokenizer.from_pretrained(init / "model")
    model = AutoModelForCausalLM.from_pretrained(init / "model")
    ref_model = AutoModelForCausalLM.from_pretrained(init / "model").eval().requires_grad_(False)
    margin_before = preference_margin(model, tokenizer, pairs)
    trainable, lengths = check_pair_lengths(tokenizer, pairs, cfg.max_length)
    if not trainable:
        raise DataError(f"every one of the {len(pairs)} preference pairs has a prompt of max_length={cfg.max_length} "
                        "tokens or more (raise max_length)")

    # TRL's conversational format: it renders prompt + assistant turn through the chat template, so the
    # completion tokens are the action target + EOS as in behaviour cloning (plus the template's newline after
    # EOS, which is never generated: generation ends at EOS or </action>).
    dataset = Dataset.from_list([
        {"prompt": p.prompt, "chosen": [{"role": "assistant", "content": p.chosen}],
         "rejected": [{"role": "assistant", "content": p.rejected}]}
        for p in trainable
    ])
    ckpt_dir = run / "checkpoints"  # + tensorboard logs in checkpoints/runs
    args = DPOConfig(
        output_dir=str(ckpt_dir),
        beta=cfg.beta,
        learning_rate=cfg.learning_rate,
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size,
        max_length=cfg.max_length,
        logging_steps=cfg.logging_steps,
        save_strategy="epoch",
        save_total_limit=1,
        seed=cfg.seed,
        bf16=False,  # TRL defaults to bf16, ~8x slower on CPUs without bf16 units
        activation_checkpointing=False,  # TRL turns it on by default; it only costs time for small models
        use_cpu=not torch.cuda.is_available(),
        report_to=["tensorboard"],
        disable_tqdm=True,
    )
    trainer = DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=dataset,
                         processing_class=tokenizer)
    last = get_last_checkpoint(str(ckpt_dir)) if ckpt_dir.is_dir() else None
    t0 = time.monotonic()
    result = trainer.train(resume_from_checkpoint=last)
    seconds = time.monotonic() - t0
    trained: Any = trainer.model
    save_policy(run, trained, tokenizer, policy_cfg)
    summary = {
        "algo": "dpo",
        "init": str(init),
        "data": [str(p) for p in data_paths],
        "real_transitions": sum(t.num_steps for t in trajs),
        "trajectories": len(trajs),
        "pairs": len(pairs),
        "trained_pairs": len(trainable),
        "pairs_prompt_too_long": lengths["prompt_too_long"],
        "pairs_completion_cut": lengths["completion_cut"],
        "epochs": trainer.state.epoch,
        "steps": trainer.state.global_step,
        "train_loss": result.training_loss,
        "margin_before": margin_before,
        "margin_after": preference_margin(trained, tokenizer, pairs),
        "seconds": round(seconds, 1),
        "resumed_from": last,
        "dpo_config": cfg.model_dump(),
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
