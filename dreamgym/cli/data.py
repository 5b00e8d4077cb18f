"""CLI: ``dreamgym collect`` (offline trajectories) and ``dreamgym eval`` (score a policy)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from dreamgym.cli.env import parse_env_args, split_option

console = Console(stderr=True)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("success {task.fields[success]:.2f}"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


def _policy_kwargs(noise: float | None) -> dict[str, float]:
    return {} if noise is None else {"noise": noise}


def collect(
    env_name: str = typer.Option("shop", "--env", help="registered env name"),
    policy: str = typer.Option("noisy", help="scripted policy: oracle | random | noisy"),
    episodes: int = typer.Option(100, min=1, help="number of episodes"),
    split: str = typer.Option("train", help="task split: train | val | test", callback=split_option),
    seed: int = typer.Option(0, help="seed: episode i uses seed+i"),
    out: Path = typer.Option(..., help="output file (.jsonl appends safely; .parquet is written at the end)"),
    noise: float = typer.Option(None, help="error rate of the noisy policy"),
    env_arg: list[str] = typer.Option(None, "--env-arg", help="env constructor argument key=value"),
) -> None:
    """Collect offline trajectories with a scripted policy.

    JSONL output is appended one trajectory at a time (flushed + fsynced), so an interrupted run keeps every
    finished trajectory; rerunning the same command continues where it stopped.
    """
    from dreamgym.collect import iter_episodes
    from dreamgym.envs import make
    from dreamgym.types import JsonlWriter, read_trajectories, write_parquet

    if out.is_dir():  # checked before any episode is played
        raise ValueError(f"{out}: is a directory; --out is a .jsonl or .parquet file")
    env = make(env_name, **parse_env_args(env_arg))
    pol = env.scripted_policy(policy, seed=seed, **_policy_kwargs(noise))
    done_already = 0
    # Opening the writer first cuts a torn last line left by a killed run, so the resume count can read the file.
    writer = JsonlWriter(out) if out.suffix == ".jsonl" else None
    if writer is not None and out.stat().st_size:
        # Resume: count the episodes this exact command already wrote (same policy, split and seed range).
        for t in read_trajectories(out):
            m = t.meta
            if t.policy == pol.name and m.get("split") == split and seed <= int(m.get("seed", -1)) < seed + episodes:
                done_already += 1
        if done_already:
            console.print(f"resuming: {done_already} of {episodes} episodes already in {out}")
    successes = 0
    trajs = []
    try:
        with _progress() as bar:
            task = bar.add_task(f"collect {policy}", total=episodes, completed=done_already, success=0.0)
            for i, traj in enumerate(iter_episodes(env, pol, episodes, split=split, seed=seed, skip=done_already)):
                if writer:
                    writer.write(traj)
                else:
                    trajs.append(traj)
                successes += traj.success
                bar.update(task, advance=1, success=successes / (i + 1))
    finally:
        if writer:
            writer.close()
        env.close()
    if writer is None:
        write_parquet(out, trajs)
    n = episodes - done_already
    console.print(f"wrote {n} trajectories to {out} (success rate {successes / max(n, 1):.3f})")


def eval_cmd(
    env_name: str = typer.Option("shop", "--env", help="registered env name"),
    policy: str = typer.Option("oracle", help="scripted policy name (oracle | random | noisy) or a policy run dir"),
    split: str = typer.Option("test", help="task split: train | val | test", callback=split_option),
    episodes: int = typer.Option(100, min=1, help="number of episodes"),
    seed: int = typer.Option(0, help="seed"),
    noise: float = typer.Option(None, help="error rate of the noisy policy"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    env_arg: list[str] = typer.Option(None, "--env-arg", help="env constructor argument key=value"),
    decoding: str = typer.Option(None, help="a policy run dir's greedy decoding: free | admissible (guided to the "
                                 "admissible actions' answers); default: the run's own"),
) -> None:
    """Evaluate a policy: success rate, mean reward, mean steps, invalid-action rate.

    ``--policy`` is a scripted policy of the env, or a policy run directory (an LLM policy, played greedily
    in batched episodes on the same tasks and seeds as the scripted policies)."""
    from dreamgym.collect import evaluate_scripted
    from dreamgym.envs import make

    if decoding not in (None, "free", "admissible"):
        raise ValueError(f"--decoding {decoding!r}: free or admissible")
    if Path(policy).is_dir():
        _eval_llm_policy(env_name, policy, split, episodes, seed, as_json, env_arg, decoding)
        return
    env = make(env_name, **parse_env_args(env_arg))
    pol = env.scripted_policy(policy, seed=seed, **_policy_kwargs(noise))
    with _progress() as bar:
        task = bar.add_task(f"eval {policy}", total=episodes, success=0.0)
        wins = [0, 0]

        def tick(t: object) -> None:
            wins[0] += bool(getattr(t, "success", False))
            wins[1] += 1
            bar.update(task, advance=1, success=wins[0] / wins[1])

        result = evaluate_scripted(env, pol, episodes, split=split, seed=seed, on_episode=tick)
    env.close()
    out = {"env": env_name, "policy": policy, "split": split, **result.to_dict()}
    if as_json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            console.print(f"{k:>20}: {v}")


def _eval_llm_policy(
    env_name: str, run_dir: str, split: str, episodes: int, seed: int, as_json: bool, env_arg: list[str] | None,
    decoding: str | None = None,
) -> None:
    from dreamgym.agent.policy import load_policy
    from dreamgym.envs.pool import env_factory
    from dreamgym.rl.evaluate import evaluate_policy

    llm_policy = load_policy(run_dir)
    if decoding is not None:
        llm_policy.cfg = llm_policy.cfg.model_copy(update={"decoding": decoding})
    console.print(f"eval {run_dir} on {episodes} {split} episodes (greedy, batched)")
    result = evaluate_policy(llm_policy, env_factory(env_name, **parse_env_args(env_arg)), split=split,
                             episodes=episodes, seed=seed)
    out = {"env": env_name, "policy": run_dir, "split": split, "decoding": llm_policy.cfg.decoding,
           **result.to_dict(), "unparsed": llm_policy.unparsed}
    if as_json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            console.print(f"{k:>20}: {v}")


def register(app: typer.Typer) -> None:
    app.command("collect")(collect)
    app.command("eval")(eval_cmd)
