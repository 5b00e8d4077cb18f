"""CLI: ``dreamgym baseline sft`` (behaviour cloning) and ``dreamgym baseline dpo`` (success-vs-failure DPO)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

baseline_app = typer.Typer(help="Offline baselines for the LLM policy.", no_args_is_help=True)
console = Console(stderr=True)


@baseline_app.command("sft")
def sft_cmd(
    data: list[Path] = typer.Option(..., "--data", help="trajectory file (.jsonl/.parquet); repeat"),
    model: str = typer.Option("pretrained", help="pretrained | pretrained-policy (the shipped bases) | a tiny preset (micro | small | "
                              "base) | a HF model / policy run dir"),
    out: Path = typer.Option(..., help="policy run dir to write (a rerun resumes from its checkpoints)"),
    epochs: float = typer.Option(3.0, help="passes over the examples"),
    lr: float = typer.Option(1e-3, help="peak learning rate (cosine schedule)"),
    batch_size: int = typer.Option(32, help="examples per optimizer step"),
    time_budget: float | None = typer.Option(None, "--time-budget", help="stop (and save) after this many seconds"),
    vocab_size: int | None = typer.Option(None, help="BPE vocabulary of a preset (default: the preset's)"),
    history_window: int = typer.Option(3, help="previous actions shown in the agent prompt"),
    action_format: str = typer.Option("index", help="index: the policy answers an option number (the tiny CPU "
                                      "default) | typed: an option's element type and rank (option 2) | text: it "
                                      "writes the action itself"),
    answer_by_name: bool = typer.Option(False, help="index format: clone option and button clicks as their text, "
                                        "ids and long actions as numbers (the shop demo's default)"),
    prompt: str = typer.Option("full", help="full | compact: no system message, long HISTORY actions cut, and no "
                               "listed clicks the STATE shows by name (PolicyConfig.prompt; ~2x the steps a second "
                               "on the shop)"),
    answer_words: bool = typer.Option(False, help="with --answer-by-name: answer an option or button click by its "
                                      "words after a space, as the task spells them (PolicyConfig.answer_words)"),
    decision_repeat: int = typer.Option(1, min=1, help="clone each decision step (the env's EnvSpec.decision_step: "
                                        "on the shop, an option click) this many times"),
    final_repeat: int = typer.Option(1, min=1, help="clone the step that ends each trajectory (on the shop, the "
                                     "purchase) this many times"),
    on_path: bool = typer.Option(False, "--on-path", help="clone each trajectory only up to its first detour (the "
                                 "states the oracle reaches by itself), not the oracle's recoveries from the noise"),
    seed: int = typer.Option(0, help="model init and data order seed"),
    threads: int | None = typer.Option(None, help="torch CPU threads"),
) -> None:
    """Behaviour cloning: SFT of the policy on every step of the successful trajectories in --data (a noisy
    policy's random detours left out: they stay in the prompts' history, the oracle's steps are the labels)."""
    from dreamgym.agent.policy import PolicyConfig
    from dreamgym.baselines.sft import train_bc
    from dreamgym.sft import SFTConfig

    sft_cfg = SFTConfig(epochs=epochs, learning_rate=lr, batch_size=batch_size, time_budget_s=time_budget,
                        seed=seed, num_threads=threads)
    if action_format not in ("index", "typed", "text"):
        raise ValueError(f"--action-format {action_format!r}: index, typed or text")
    if prompt not in ("full", "compact"):
        raise typer.BadParameter(f"{prompt!r}: full or compact", param_hint="--prompt")
    policy_cfg = PolicyConfig(history_window=history_window, action_format=action_format,  # type: ignore[arg-type]
                              answer_by_name=answer_by_name, prompt=prompt,  # type: ignore[arg-type]
                              answer_words=answer_words)
    summary = train_bc(data, model, out, sft_cfg, policy_cfg, vocab_size, decision_repeat=decision_repeat,
                       on_path_only=on_path, final_repeat=final_repeat)
    keys = ("examples", "real_transitions", "epochs", "train_loss", "seconds")
    console.print(f"saved the behaviour-cloned policy to {out}")
    print(json.dumps({k: summary[k] for k in keys}))


@baseline_app.command("dpo")
def dpo_cmd(
    data: list[Path] = typer.Option(..., "--data", help="trajectory file with successes and failures; repeat"),
    init: Path = typer.Option(..., help="policy run dir to start from (e.g. a `baseline sft` run)"),
    out: Path = typer.Option(..., help="policy run dir to write"),
    beta: float = typer.Option(0.1, help="DPO β: strength of the pull towards the init policy"),
    epochs: float = typer.Option(3.0, help="passes over the preference pairs"),
    lr: float = typer.Option(1e-4, help="learning rate"),
    batch_size: int = typer.Option(16, help="pairs per optimizer step"),
    seed: int = typer.Option(0, help="data order seed"),
    threads: int | None = typer.Option(None, help="torch CPU threads"),
) -> None:
    """DPO on (successful step, failed step) pairs of the same task; see dreamgym.baselines.dpo for the rule."""
    from dreamgym.baselines.dpo import DPOTrainConfig, train_dpo

    cfg = DPOTrainConfig(beta=beta, epochs=epochs, learning_rate=lr, batch_size=batch_size, seed=seed,
                         num_threads=threads)
    summary = train_dpo(data, init, out, cfg)
    keys = ("pairs", "real_transitions", "epochs", "train_loss", "margin_before", "margin_after", "seconds",
            "pairs_prompt_too_long", "pairs_completion_cut")
    console.print(f"saved the DPO policy to {out}")
    print(json.dumps({k: summary[k] for k in keys}))


def register(app: typer.Typer) -> None:
    app.add_typer(baseline_app, name="baseline")
