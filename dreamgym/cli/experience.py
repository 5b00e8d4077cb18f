"""CLI: ``dreamgym annotate`` (reasoning traces), ``dreamgym train-exp`` (SFT of the experience model) and
``dreamgym eval-exp`` (its fidelity report on held-out real transitions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

if TYPE_CHECKING:
    from dreamgym.experience.annotate import FileProgress
    from dreamgym.llm.base import LLMConfig

console = Console(stderr=True)


def load_llm_config(
    path: Path | None, backend: str | None, model: str | None, base_url: str | None, device: str | None
) -> LLMConfig:
    """An :class:`LLMConfig` from a YAML file, with any of the flags overriding its fields."""

    from dreamgym.llm.base import LLMConfig
    from dreamgym.types import read_yaml_mapping

    fields: dict[str, object] = {}
    if path is not None:
        fields.update(read_yaml_mapping(path, "LLM config"))
    overrides = {"backend": backend, "model": model, "base_url": base_url, "device": device}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    if "model" not in fields:
        raise ValueError("--annotator llm needs a teacher: --llm-config FILE or --model NAME")
    try:
        return LLMConfig.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "config"
        raise ValueError(f"LLM config: {where}: {err['msg']}") from None


def annotate(
    data: list[Path] = typer.Option(..., "--data", help="trajectory file (.jsonl/.parquet); repeat for more"),
    out: Path = typer.Option(..., "--out", help="output JSONL (appended; trajectories already in it are skipped)"),
    annotator: str = typer.Option("rule", help="rule (the env's ground-truth explainer) | diff (any env: what "
                                  "each action changed) | llm (a teacher model)"),
    llm_config: Path | None = typer.Option(None, "--llm-config", help="teacher LLMConfig as YAML"),
    backend: str | None = typer.Option(None, help="teacher backend: hf | openai (overrides --llm-config)"),
    model: str | None = typer.Option(None, help="teacher model dir / served name (overrides --llm-config)"),
    base_url: str | None = typer.Option(None, help="openai backend URL, e.g. http://127.0.0.1:8000/v1"),
    device: str | None = typer.Option(None, help="hf backend torch device"),
    batch_size: int = typer.Option(16, min=1, help="trajectories per batch (one teacher call; one append)"),
    retries: int = typer.Option(2, min=0, help="llm: new-seed attempts after a malformed answer"),
    max_new_tokens: int = typer.Option(2048, min=1, help="llm: token limit of an answer"),
    temperature: float = typer.Option(0.7, min=0.0, help="llm: sampling temperature"),
    seed: int = typer.Option(0, help="llm: sampling seed"),
    max_state_chars: int = typer.Option(1500, min=1, help="llm: each state in the prompt is cut to this"),
    max_reasoning_chars: int = typer.Option(600, min=1, help="each trace is cut to this many characters"),
    fallback: str = typer.Option("rule", help="llm: traces for unusable answers: rule | empty"),
    threads: int | None = typer.Option(None, help="torch CPU threads (hf backend)"),
    as_json: bool = typer.Option(False, "--json", help="print the run's counts as one JSON object"),
) -> None:
    """Annotate trajectories with reasoning traces (info.reasoning per step, meta.task_tutorial).

    Output is appended one batch at a time (flushed + fsynced); rerunning the same command resumes. Every
    teacher answer that cannot be used after the retries is replaced by the fallback and counted.
    """
    from dreamgym.experience.annotate import (
        Annotator,
        DiffAnnotator,
        LLMAnnotator,
        RuleAnnotator,
        TeacherConfig,
        annotate_file,
        check_output,
    )

    check_output(data, out)  # before a teacher is loaded
    worker: Annotator
    if annotator == "rule":
        worker = RuleAnnotator(max_reasoning_chars)
    elif annotator == "diff":
        worker = DiffAnnotator(max_reasoning_chars)
    elif annotator == "llm":
        if fallback not in ("rule", "empty"):
            raise ValueError(f"--fallback must be rule or empty, got {fallback!r}")
        cfg = load_llm_config(llm_config, backend, model, base_url, device)
        teacher = TeacherConfig(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            retries=retries,
            seed=seed,
            batch_size=batch_size,
            max_state_chars=max_state_chars,
            max_reasoning_chars=max_reasoning_chars,
            fallback="rule" if fallback == "rule" else "empty",
        )
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        from dreamgym.llm.load import load_llm

        worker = LLMAnnotator(load_llm(cfg), teacher, name=f"llm:{cfg.model}")
    else:
        raise ValueError(f"--annotator must be rule, diff or llm, got {annotator!r}")

    bar = Progress(
        TextColumn(f"[bold]annotate ({annotator})"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("fallbacks {task.fields[fallbacks]}"),
        TimeRemainingColumn(),
        console=console,
    )
    task = bar.add_task("annotate", total=None, fallbacks=0)

    def tick(p: FileProgress) -> None:
        bar.update(task, total=p.total, completed=p.written, fallbacks=p.stats.fallbacks)

    with bar:
        result = annotate_file(data, worker, out, batch_size=batch_size, on_progress=tick)
    summary = {"out": str(out), "written": result.written, "skipped": result.skipped, **result.stats.as_dict()}
    if as_json:
        print(json.dumps(summary))
    else:
        console.print(
            f"wrote {result.written} annotated trajectories to {out} ({result.skipped} already there); "
            f"fallbacks {result.stats.fallbacks}; counts {dict(result.stats.counts)}",
            highlight=False,
        )


def train_exp(
    data: list[Path] = typer.Option(..., "--data", help="annotated trajectory file (.jsonl/.parquet); repeat"),
    out: Path = typer.Option(..., "--out", help="model directory (model, tokenizer, experience.json, summary.json)"),
    model: str | None = typer.Option(None, help="micro | small | base | <hidden>x<layers> (fresh) or HF path"),
    config: Path | None = typer.Option(None, help="YAML of ExpTrainConfig fields (e.g. configs/exp-shop-tiny.yaml)"),
    buffer: Path | None = typer.Option(None, help="replay buffer for the neighbours (default OUT/buffer)"),
    encoder: str | None = typer.Option(None, help="buffer encoder: hashing | minilm"),
    k: int | None = typer.Option(None, min=0, help="retrieved neighbours per prompt (0: without replay)"),
    history: int | None = typer.Option(None, min=0, help="previous steps in the prompt (0: without history)"),
    no_reasoning: bool = typer.Option(False, "--no-reasoning", help="no <think> trace in the target"),
    epochs: float | None = typer.Option(None, help="SFT epochs"),
    lr: float | None = typer.Option(None, help="learning rate"),
    batch_size: int | None = typer.Option(None, min=1, help="examples per step"),
    time_budget: float | None = typer.Option(None, help="stop after this many seconds in all (the buffer, "
                                             "examples and tokenizer included)"),
    max_length: int | None = typer.Option(None, min=16, help="tokens per example (a long prompt loses neighbours, then history, then state lines)"),
    threads: int | None = typer.Option(None, min=1, help="torch CPU threads"),
    snapshot_every: float | None = typer.Option(None, help="keep a loadable snapshot every this many seconds"),
    seed: int | None = typer.Option(None, help="seed (shuffle, mixture, initialisation)"),
    reward_head: bool | None = typer.Option(None, "--reward-head/--no-reward-head", help="the reward of the steps "
                                            "M_exp ends from a head fitted on the data's real endings"),
) -> None:
    """Train the experience model M_exp (SFT, loss on reasoning + next state + reward/done tokens only).

    Precedence: ExpTrainConfig defaults < --config < flags. Prints the training summary as JSON.
    """
    from dreamgym.experience.train import ExpTrainConfig, train_experience_model
    from dreamgym.types import read_yaml_mapping

    fields = read_yaml_mapping(config, "train-exp config") if config is not None else {}
    protocol, sft = dict(fields.get("protocol") or {}), dict(fields.get("sft") or {})
    protocol_flags = {"k": k, "history_window": history, "reasoning": False if no_reasoning else None}
    sft_flags = {"epochs": epochs, "learning_rate": lr, "batch_size": batch_size, "time_budget_s": time_budget,
                 "max_length": max_length, "num_threads": threads}
    protocol.update({key: v for key, v in protocol_flags.items() if v is not None})
    sft.update({key: v for key, v in sft_flags.items() if v is not None})
    top = {"model": model, "encoder": encoder, "snapshot_every_s": snapshot_every, "seed": seed,
           "reward_head": reward_head}
    fields.update({key: v for key, v in top.items() if v is not None}, protocol=protocol, sft=sft)
    cfg = ExpTrainConfig.model_validate(fields)  # a ValidationError names the field (dreamgym.cli.describe)
    try:
        protocol_cfg, sft_cfg = cfg.protocol_config(), cfg.sft_config()
    except TypeError as e:  # an unknown protocol field
        raise ValueError(f"train-exp config: {str(e).splitlines()[0]}") from None
    console.print(f"train-exp config: {cfg.model_dump_json()}", highlight=False, soft_wrap=True)
    summary = train_experience_model(
        data, cfg.model, out, protocol_cfg, sft_cfg, buffer_dir=buffer, encoder=cfg.encoder, chat=cfg.chat,
        vocab_size=cfg.vocab_size, mixture=cfg.mixture, snapshot_every_s=cfg.snapshot_every_s, seed=cfg.seed,
        reward_head=cfg.reward_head, reserve_prompt=cfg.reserve_prompt,
    )
    print(json.dumps(summary))


def eval_exp(
    model: Path = typer.Option(..., "--model", help="experience-model directory (from train-exp)"),
    data: list[Path] = typer.Option(..., "--data", help="held-out real trajectory file; repeat"),
    buffer: Path | None = typer.Option(None, help="replay buffer for the neighbours (default MODEL/buffer if k > 0)"),
    max_transitions: int | None = typer.Option(None, min=1, help="evaluate whole trajectories up to this many steps"),
    show: int = typer.Option(0, min=0, help="print real vs dreamt next state for this many sampled steps"),
    batch_size: int = typer.Option(64, min=1, help="steps per batched model call"),
    seed: int = typer.Option(0, help="seed (trajectory order, sampling)"),
    gamma: float = typer.Option(0.99, help="discount for the Lemma 1 bound"),
    horizon: int = typer.Option(15, min=1, help="episode length for the finite-horizon bound"),
    threads: int | None = typer.Option(None, min=1, help="torch CPU threads"),
    judge_model: str | None = typer.Option(None, help="LLM judge (HF dir or served name): adds the 4 rubrics"),
    judge_backend: str = typer.Option("hf", help="judge backend: hf | openai"),
    judge_base_url: str | None = typer.Option(None, help="openai judge URL, e.g. http://127.0.0.1:8000/v1"),
    judge_n: int = typer.Option(100, min=1, help="transitions the judge scores"),
    policy: Path | None = typer.Option(None, help="policy run dir: replay its dreamt episodes in the real env "
                                       "(wm2real)"),
    policy_episodes: int = typer.Option(50, min=1, help="--policy: dreamt episodes (distinct held-out tasks)"),
    report_out: Path | None = typer.Option(None, "--report-out", help="also write the full JSON report here"),
    as_json: bool = typer.Option(False, "--json", help="print the full report as one JSON object"),
) -> None:
    """Fidelity of an experience model on held-out real transitions (teacher-forced): reward/done accuracy beside
    their trivial baselines, next-state F1 by page, ε_R (all / terminal steps), ε_P, the Lemma 1 bound, the env's
    consistency checks, optional LLM judge; with --policy, how often its dreamt episodes end as their real replay."""
    from dreamgym.experience.fidelity import evaluate_experience_model, format_report, format_side_by_side
    from dreamgym.experience.model import ExperienceModel
    from dreamgym.experience.train import read_training_data

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"{model}: not a model directory (no config.json)")
    if policy is not None and not policy.is_dir():
        raise FileNotFoundError(f"{policy}: no such policy run directory")
    heldout = read_training_data(data)
    exp = ExperienceModel.load(model)
    buffer_dir = buffer if buffer is not None else (model / "buffer" if (model / "buffer").is_dir() else None)
    if exp.protocol.k > 0 and buffer_dir is not None:
        from dreamgym.replay import ReplayBuffer

        if not buffer_dir.is_dir():
            raise FileNotFoundError(f"{buffer_dir}: no such replay buffer")
        exp.buffer = ReplayBuffer.open(buffer_dir, create=False, read_only=True)
    elif exp.protocol.k > 0:
        console.print("[yellow]warning:[/yellow] the model was trained with k > 0 but no buffer was found: "
                      "prompts get no neighbours", highlight=False)
    judge = None
    if judge_model is not None:
        from dreamgym.llm.base import LLMConfig
        from dreamgym.llm.load import load_llm

        judge = load_llm(LLMConfig.model_validate({"backend": judge_backend, "model": judge_model,
                                                   "base_url": judge_base_url}))
    agent = None
    if policy is not None:
        from dreamgym.agent.policy import load_policy

        agent = load_policy(policy)
    report = evaluate_experience_model(exp, heldout, max_transitions, seed, batch_size, show, gamma, horizon,
                                       judge=judge, judge_n=judge_n)
    if agent is not None:
        from dreamgym.rl.wm2real import policy_wm2real

        report["wm2real"] = policy_wm2real(exp, agent, heldout, policy_episodes, seed, horizon)
    if report_out is not None:
        report_out.parent.mkdir(parents=True, exist_ok=True)
        report_out.write_text(json.dumps(report, indent=2))
    if as_json:
        print(json.dumps(report))
        return
    lines = [format_side_by_side(report["side_by_side"]), ""] if show else []
    lines.append(format_report(report))
    lines.append(f"{'next_state_f1_by_page':46s} {json.dumps(report['next_state_f1_by_page'])}")
    lines.append(f"{'seconds / steps_per_s':46s} {report['seconds']} / {report['steps_per_s']}")
    typer.echo("\n".join(lines))


def register(app: typer.Typer) -> None:
    app.command("annotate")(annotate)
    app.command("train-exp")(train_exp)
    app.command("eval-exp")(eval_exp)
