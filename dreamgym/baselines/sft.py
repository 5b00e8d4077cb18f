"""Behaviour cloning (BC): the SFT baseline, and the warm start of every RL run on tiny models.

Each step of a (successful) offline trajectory becomes one :class:`~dreamgym.sft.SFTExample`: the prompt
is the agent prompt the policy would have seen at that step (instruction, state, admissible actions, previous
actions), built by :func:`~dreamgym.agent.policy.build_agent_prompt` exactly as ``LLMPolicy.act`` builds it,
and the target is ``<action>…</action>``. Training is the shared masked-SFT routine (loss on target tokens).

The offline data budget is reported as ``real_transitions``: every transition in the data files used,
including those of the failed trajectories that BC does not train on.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dreamgym.agent.policy import (
    AgentObservation,
    PolicyConfig,
    action_target,
    build_agent_prompt,
    save_policy,
)
from dreamgym.envs import find_spec
from dreamgym.sft import SFTConfig, SFTExample, train_sft
from dreamgym.software import software
from dreamgym.types import DataError, Trajectory, read_trajectories

log = logging.getLogger(__name__)


def read_data(paths: Sequence[str | os.PathLike[str]]) -> list[Trajectory]:
    """All trajectories of the given ``.jsonl``/``.parquet`` files, in file order."""
    if not paths:
        raise ValueError("no data files given")
    trajs: list[Trajectory] = []
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such data file")
        trajs.extend(read_trajectories(path))
    if not trajs:
        raise DataError(f"{', '.join(map(str, paths))}: no trajectories")
    return trajs


def agent_observations(traj: Trajectory) -> list[AgentObservation]:
    """What the agent saw at each step of ``traj``: the state, the admissible actions recorded with it
    (``Transition.info["admissible_actions"]``, empty when the data has none), and all previous
    (state, action) pairs — invalid steps included, as an acting loop records them."""
    observations = []
    for t, x in enumerate(traj.transitions):
        history = [(prev.state, prev.action) for prev in traj.transitions[:t]]
        admissible = [str(a) for a in x.info.get("admissible_actions") or []]
        observations.append(AgentObservation(traj.task.instruction, x.state, admissible, history))
    return observations


def on_path(traj: Trajectory) -> Trajectory:
    """``traj`` up to (not including) its first detour (``info["detour"]``): the states its oracle reaches by
    itself. ``success`` stays the whole trajectory's."""
    cut = next((i for i, x in enumerate(traj.transitions) if x.info.get("detour")), len(traj.transitions))
    return traj if cut == len(traj.transitions) else traj.model_copy(update={"transitions": traj.transitions[:cut]})


def bc_examples(
    trajs: Sequence[Trajectory], policy_cfg: PolicyConfig, only_successful: bool = True, skip_detours: bool = True,
    decision_repeat: int = 1, on_path_only: bool = False, final_repeat: int = 1,
) -> list[SFTExample]:
    """One example per valid step of the (successful) trajectories. Steps flagged ``invalid_action`` are
    skipped (they changed nothing: cloning them teaches a wasted turn) and counted in the log, as are steps
    without recorded admissible actions. With ``skip_detours``, so are a noisy policy's random steps
    (``info["detour"]``): they stay in the later prompts' history, but the policy learns only the oracle's
    actions, including its recoveries from them.

    ``decision_repeat``: each decision step (the env's ``EnvSpec.decision_step``: on the shop, clicking one of an
    item page's options) appears that many times (the same example object, tokenized once): at 6, 59% of the
    shop's examples, and a policy cloned on them matches the option the task names (``benchmarks/bc_options.py``).

    ``on_path_only``: each trajectory only up to its first detour (:func:`on_path`), so not the oracle's recoveries
    from the noise. A recovery's label depends on the history (on the shop, 29% of the results-page steps answer
    "back to search" after a detour's search, the rest click a product), which a small policy learns late: cloned
    on-path, the shop's policy plays the search, click, buy plan after 900 steps of 16, where it had not yet
    opened a product after 1,000 (``benchmarks/bc_options.py --on-path``, README).

    ``final_repeat``: the step that ends each cloned trajectory (done: on the shop, the purchase) appears that many
    times. With decision steps repeated, the step after the last of them is rare by comparison: cloned with the
    shop's option clicks ×12 from the policy's base, 56 of 200 val episodes selected the task's options and then
    clicked the last one again until the step limit, never buying (journal, "The policy's base shipped").
    On-path, a trajectory cut at a detour has no final step."""
    if decision_repeat < 1 or final_repeat < 1:
        raise ValueError(f"decision_repeat and final_repeat must be >= 1, got {decision_repeat}, {final_repeat}")
    examples: list[SFTExample] = []
    invalid = missing_admissible = detours = decisions = finals = 0
    deciders: dict[str, Any] = {}  # env name -> its EnvSpec.decision_step (None: none), looked up once
    for traj in trajs:
        if only_successful and not traj.success:
            continue
        if on_path_only:
            traj = on_path(traj)
        if decision_repeat > 1 and traj.task.env not in deciders:
            env_spec = find_spec(traj.task.env)
            deciders[traj.task.env] = env_spec.load("decision_step") if env_spec is not None else None
        decision = deciders.get(traj.task.env)
        for obs, x in zip(agent_observations(traj), traj.transitions, strict=True):
            if x.info.get("invalid_action"):
                invalid += 1
                continue
            if skip_detours and x.info.get("detour"):
                detours += 1
                continue
            if "admissible_actions" not in x.info:
                missing_admissible += 1
            example = SFTExample(build_agent_prompt(obs, policy_cfg), action_target(obs, x.action, policy_cfg))
            repeat = decision_repeat if decision is not None and decision(x.state, x.action, obs.admissible_actions) \
                else 1
            decisions += repeat > 1
            if x.done and final_repeat > 1:
                repeat, finals = max(repeat, final_repeat), finals + 1
            examples.extend([example] * repeat)
    if finals:
        log.info("behaviour cloning: %d final steps, each %d times", finals, final_repeat)
    if decisions:
        log.info("behaviour cloning: %d decision steps, each %d times", decisions, decision_repeat)
    elif decision_repeat > 1:
        log.warning("behaviour cloning: decision_repeat=%d, but no step is a decision step (the env's EnvSpec has "
                    "no decision_step, or the data has none)", decision_repeat)
    if invalid:
        log.info("behaviour cloning: skipped %d invalid-action steps", invalid)
    if detours:
        log.info("behaviour cloning: skipped %d detour steps of a noisy policy", detours)
    if missing_admissible and policy_cfg.show_admissible:
        log.warning(
            "behaviour cloning: %d of %d steps have no recorded admissible actions, so their prompts lack the "
            "ACTIONS line that acting shows (recollect the data with this version of dreamgym)",
            missing_admissible, len(examples),
        )
    return examples


# ------------------------------------------------------------------------------------------ models


def tokenizer_corpus(trajs: Sequence[Trajectory], examples: Sequence[SFTExample]) -> Iterator[str]:
    """Text for a preset's BPE: instructions, states and actions of all the data, plus the rendered agent
    prompts and targets, so that the prompt template's words become single tokens too."""
    for traj in trajs:
        yield traj.task.instruction
        for x in traj.transitions:
            yield x.state
            yield x.action
    for ex in examples:
        yield from (m["content"] for m in ex.prompt) if isinstance(ex.prompt, list) else (ex.prompt,)
        yield ex.target


def init_model(
    model: str, trajs: Sequence[Trajectory], examples: Sequence[SFTExample], vocab_size: int | None, seed: int
) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a fresh tiny model with a BPE trained on the data for a preset name, else a
    Hugging Face model directory (a policy run dir's ``model/`` is found too) or hub name."""
    from dreamgym.llm.tiny import PRESETS, build_model, build_tokenizer, tiny_shape

    tokenizer: Any
    shape = tiny_shape(model)
    if shape is not None:
        tokenizer = build_tokenizer(tokenizer_corpus(trajs, examples), vocab_size or shape.vocab_size)
        return build_model(shape, tokenizer, seed=seed), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dreamgym.llm.pretrained import resolve_model

    model = resolve_model(model)
    path = Path(model) / "model" if (Path(model) / "model").is_dir() else Path(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        hf_model = AutoModelForCausalLM.from_pretrained(path)
    except OSError as e:
        raise ValueError(f"--model {model}: not a preset ({', '.join(PRESETS)}) nor a loadable model: {str(e).splitlines()[0]}") from None
    if tokenizer.chat_template is None:
        raise ValueError(f"--model {model}: its tokenizer has no chat template (the agent prompt is a chat)")
    return hf_model, tokenizer


def train_bc(
    data_paths: Sequence[str | os.PathLike[str]],
    model: str,
    out_run_dir: str | os.PathLike[str],
    sft_cfg: SFTConfig,
    policy_cfg: PolicyConfig,
    vocab_size: int | None = None,
    skip_detours: bool = True,
    decision_repeat: int = 1,
    on_path_only: bool = False,
    final_repeat: int = 1,
) -> dict[str, Any]:
    """Behaviour-clone the successful trajectories of ``data_paths`` (see :func:`bc_examples`) into a policy run
    dir; return the summary (also written to ``out_run_dir/summary.json``). A rerun into the same dir resumes from
    its checkpoints."""
    run = Path(out_run_dir)
    if (run / "summary.json").exists():
        raise ValueError(f"{run}: already holds a finished run (summary.json); choose another --out")
    started = time.monotonic()
    trajs = read_data(data_paths)
    examples = bc_examples(trajs, policy_cfg, skip_detours=skip_detours, decision_repeat=decision_repeat,
                           on_path_only=on_path_only, final_repeat=final_repeat)
    if not examples:
        raise DataError(f"{', '.join(map(str, data_paths))}: no successful trajectories to clone")
    hf_model, tokenizer = init_model(model, trajs, examples, vocab_size, sft_cfg.seed)
    t0 = time.monotonic()
    prep_s = t0 - started
    sft_cfg = sft_cfg.after(prep_s)  # the budget covers reading the data and building the tokenizer too
    # train_sft writes the final weights + tokenizer into run/model (checkpoints in run/model/checkpoints);
    # save_policy then adds policy.json beside it (re-saving the same, in-place trained weights).
    stats = train_sft(hf_model, tokenizer, examples, run / "model", sft_cfg)
    if sft_cfg.lora:  # the merged model is a new module tree: take the weights train_sft saved
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(run / "model")
    save_policy(run, hf_model, tokenizer, policy_cfg)
    summary = {
        "algo": "bc",
        "model": model,
        "parameters": sum(p.numel() for p in hf_model.parameters()),
        "data": [str(p) for p in data_paths],
        "real_transitions": sum(t.num_steps for t in trajs),
        "trajectories": len(trajs),
        "successful_trajectories": sum(t.success for t in trajs),
        "skip_detours": skip_detours,
        "decision_repeat": decision_repeat,
        "on_path_only": on_path_only,
        "final_repeat": final_repeat,
        "examples": len(examples),
        "distinct_examples": len({id(e) for e in examples}),
        **stats,
        "seconds": round(time.monotonic() - t0, 1),
        "prep_seconds": round(prep_s, 1),
        "sft_config": sft_cfg.model_dump(),
        "software": software(),
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
