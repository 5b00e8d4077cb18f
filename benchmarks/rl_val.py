"""Choose an RL setting on the val split (issue 13: settings are chosen on val, test is for final tables).

Each value of ``--field`` trains from the same SFT policy with the same seed and is evaluated greedily on
``--eval-episodes`` val tasks: the same tasks for every value of a seed, so the values pair task by task with the
first one. The RL settings are the demo's (``DemoConfig().rl``) on the shop's train split with ``val_fraction=0.1``,
or with ``--config`` a YAML of RLConfig fields (e.g. a bench row's ``config.yaml``: its env, env_kwargs and, for a
dream row, its dream), with ``--env-arg`` overriding env_kwargs (e.g. more val games).

    # GRPO-real from the on-path cloned policy, against that policy itself (--against-start)
    .venv/bin/python benchmarks/rl_val.py --init runs/onpath/p-s0 --field iterations --values 6 --seeds 0 1 2 \
        --against-start --work runs/rl_val_onpath --out benchmarks/results/rl_val_onpath.json
    .venv/bin/python benchmarks/rl_val.py --init runs/onpath/p-s0 --field lr --values 1e-3 --seeds 0 1 2 \
        --against-start --work runs/rl_val_onpath --out benchmarks/results/rl_val_onpath_lr.json
    .venv/bin/python benchmarks/rl_val.py --init runs/onpath/p-s0 --field temperature --values 0.5 --seeds 0 1 2 \
        --against-start --work runs/rl_val_onpath --out benchmarks/results/rl_val_onpath_temperature.json
    # with invalid action masking (rollouts sample among the admissible actions' answers only)
    .venv/bin/python benchmarks/rl_val.py --init runs/onpath/p-s0 --field lr --values 1e-4 1e-3 \
        --set action_masking=true --seeds 0 1 2 --against-start --work runs/rl_val_onpath \
        --out benchmarks/results/rl_val_onpath_masking.json
    .venv/bin/python benchmarks/rl_val.py --init runs/onpath/p-s0 --field lr --values 3e-4 --set action_masking=true \
        --set tasks_per_iter=32 --set group_size=4 --iterations 10 --seeds 0 1 2 --against-start \
        --work runs/rl_val_onpath --out benchmarks/results/rl_val_onpath_masking_wide.json
    # a dream setting (DreamConfig field) for every run: TextWorld's opens answered by the recorded effect
    .venv/bin/python benchmarks/rl_val.py --config runs/twcw/seed0/dreamgym/config.yaml \
        --dream-buffer runs/twcw/seed0/buffer --init runs/twcw/seed0/sft --env-arg num_val_games=100 \
        --field no_effect_penalty --values 0 --dream-set recall_effects=true --seeds 0 1 2 --against-start \
        --eval-episodes 100 --set num_threads=1 --work runs/rl_val_ne \
        --out benchmarks/results/rl_val_textworld_recall_effects.json
    # where GRPO's invalid-action penalty goes (item 8): episode (in the return, shared by the episode's turns)
    # or step (on the invalid turn's own advantage, as verl-agent does)
    .venv/bin/python benchmarks/rl_val.py --init runs/bench/seed0/sft --field invalid_penalty_mode \
        --values episode step --seeds 0 1 2 --out benchmarks/results/rl_val_invalid_penalty.json
    .venv/bin/python benchmarks/rl_val.py --init runs/bench/seed0/sft --field lr --values 1e-4 1e-3 3e-3 \
        --seeds 0 --out benchmarks/results/rl_val_lr.json
    # TextWorld GRPO-real from the bench's SFT policy, with the bench row's settings, on 100 val games
    .venv/bin/python benchmarks/rl_val.py --config configs/textworld-rl-val.yaml --init runs/twe/seed0/sft \
        --env-arg num_val_games=100 --field lr --values 1e-4 1e-3 --seeds 0 1 2 --against-start \
        --eval-episodes 100 --work runs/rl_val_tw --out benchmarks/results/rl_val_textworld_lr.json

Writes ``--out`` (with the command): per value the val success and mean reward (mean with a 95% bootstrap CI over
seeds, then tasks) and the difference from the first value, paired on the same tasks, with its CI and the sign
test. Each run is cached in ``--work/<field>=<value>-s<seed>`` (its summary.json); a dream run adds its rollouts to
its own copy of the buffer there (``--dream-buffer``), so that no run retrieves another's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, NoReturn

import yaml

from dreamgym.pipeline import DemoConfig, copy_dream_buffer
from dreamgym.rl.evaluate import EVAL_TASKS, EVAL_TASKS_START
from dreamgym.rl.trainer import RLConfig, train
from dreamgym.stats import bootstrap_ci, paired_bootstrap_ci, sign_test
from dreamgym.types import DataError, read_yaml_mapping

VAL_ENV = {"val_fraction": 0.1}  # the shop's env_kwargs with a val split


def run(args: argparse.Namespace, value: Any, seed: int, start: bool = False) -> list[dict[str, Any]]:
    """The per-task outcomes of the run's final evaluation, or with ``start`` of its initial policy's."""
    fixed = "".join(f"+{k}={v}" for k, v in args.fixed.items())
    fixed += "".join(f"+dream.{k}={v}" for k, v in args.dream_fixed.items())
    out = args.work / f"{args.field}={value}{fixed}-s{seed}"
    if not (out / "summary.json").exists():
        dream = {**(args.base.get("dream") or {}), **args.dream_fixed}
        if dream.get("buffer") or args.dream_buffer:  # each run adds its rollouts to its own copy of the buffer
            copy_dream_buffer(Path(args.dream_buffer or dream["buffer"]), out / "dream_buffer", out)
            dream["buffer"] = str(out / "dream_buffer")
        cfg = RLConfig.model_validate({**args.base, "init": str(args.init), "seed": seed, "iterations": args.iterations,
                                       "eval_split": "val", "eval_episodes": args.eval_episodes, "eval_every": 0,
                                       **({"dream": dream} if dream else {}), **args.fixed, args.field: value})
        train(cfg, out, resume=(out / "checkpoint").exists())
    return list(json.loads((out / (EVAL_TASKS_START if start else EVAL_TASKS)).read_text())["per_task"])


def seen_val_targets(init: Path, env_name: str) -> dict[str, int] | None:
    """How many of the val tasks' target products the init policy was cloned on (its ``summary.json``'s ``data``
    files), or None when the init does not say what it was trained on. A policy whose SFT data ran without
    ``val_fraction`` has seen every val target: val then measures settings on seen products, not held-out ones."""
    from dreamgym.envs import make
    from dreamgym.types import read_trajectories

    if env_name != "shop":  # the count is of the shop's target products
        return None
    summary = init / "summary.json"
    files = json.loads(summary.read_text()).get("data") if summary.is_file() else None
    if not files or not all(Path(f).is_file() for f in files):
        return None
    seen = {str(t.task.goal.get("asin")) for f in files for t in read_trajectories(f) if t.task.goal}
    env = make("shop", **VAL_ENV)
    val = {str(t.goal.get("asin")) for t in env.tasks("val") if t.goal}
    env.close()
    return {"val_targets": len(val), "seen_in_init_data": len(val & seen)}


def fail(message: str) -> NoReturn:
    """Bad input: the one-line message, exit 2."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", type=Path, required=True, help="the SFT policy every run starts from")
    ap.add_argument("--field", required=True, help="an RLConfig field")
    ap.add_argument("--values", nargs="+", required=True, help="its values (YAML scalars); the first is the reference")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--against-start", action="store_true",
                    help="the reference is the initial policy (each run's start evaluation, the same val tasks)")
    ap.add_argument("--config", type=Path, default=None,
                    help="YAML of RLConfig fields (env, env_kwargs, dream, ...) instead of the demo's shop settings")
    ap.add_argument("--dream-buffer", type=Path, default=None,
                    help="with a dream config: the replay buffer each run copies and adds its rollouts to (default: "
                         "the config's dream.buffer; a bench row's config names the row's own, so give its seed's "
                         "M_exp buffer, RUN/seedN/buffer)")
    ap.add_argument("--env-arg", dest="env_args", action="append", default=[], metavar="KEY=VALUE",
                    help="an env_kwargs entry (YAML value), e.g. num_val_games=100; repeatable")
    ap.add_argument("--iterations", type=int, default=None, help="default: the config's (the demo's)")
    ap.add_argument("--eval-episodes", type=int, default=200)
    ap.add_argument("--work", type=Path, default=Path("runs/rl_val"),
                    help="the runs' cache, keyed by field, value, --set and seed only: one --work per --config and init")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE",
                    help="an RLConfig field (YAML value) fixed for every run, e.g. action_masking=true; repeatable")
    ap.add_argument("--dream-set", dest="dream_sets", action="append", default=[], metavar="FIELD=VALUE",
                    help="a DreamConfig field (YAML value) of the config's dream, e.g. recall_effects=true; repeatable")
    args = ap.parse_args()
    if args.field not in RLConfig.model_fields:
        fail(f"error: unknown RLConfig field {args.field!r}")
    args.fixed = {}
    if args.config is None:
        args.base = {**DemoConfig().rl, "env": "shop", "env_kwargs": VAL_ENV}
    else:
        try:
            args.base = read_yaml_mapping(args.config, "RL config")
            RLConfig.model_validate(args.base)  # validated before any run
        except (DataError, ValueError) as exc:
            fail(f"error: --config {args.config}: {str(exc).splitlines()[0]}")
    args.base["env_kwargs"] = dict(args.base.get("env_kwargs") or {})
    for item in args.env_args:
        key, eq, text = item.partition("=")
        if not eq or not key:
            fail(f"error: --env-arg expects KEY=VALUE, got {item!r}")
        args.base["env_kwargs"][key] = yaml.safe_load(text)
    if args.dream_buffer is not None and not (args.base.get("dream") and args.dream_buffer.is_dir()):
        fail(f"error: --dream-buffer {args.dream_buffer}: needs a dream config and an existing buffer dir")
    if args.iterations is None:
        args.iterations = int(args.base.get("iterations", RLConfig.model_fields["iterations"].default))
    for item in args.sets:
        key, eq, text = item.partition("=")
        if not eq or key not in RLConfig.model_fields or key == args.field:
            fail(f"error: --set expects FIELD=VALUE with an RLConfig field other than --field, got {item!r}")
        args.fixed[key] = yaml.safe_load(text)
    from dreamgym.experience.dream import DreamConfig

    args.dream_fixed = {}
    for item in args.dream_sets:
        key, eq, text = item.partition("=")
        if not eq or key not in DreamConfig.model_fields or not args.base.get("dream"):
            fail(f"error: --dream-set expects FIELD=VALUE with a DreamConfig field, for a --config with a dream, "
                 f"got {item!r}")
        args.dream_fixed[key] = yaml.safe_load(text)
    seen = seen_val_targets(args.init, str(args.base.get("env", "shop")))
    if seen and seen["seen_in_init_data"]:
        print(f"warning: {args.init} was cloned on {seen['seen_in_init_data']} of the {seen['val_targets']} val target "
              "products (its SFT data ran without val_fraction): val compares settings on seen products", file=sys.stderr)
    values = [yaml.safe_load(v) for v in args.values]
    per = {str(v): [run(args, v, s) for s in args.seeds] for v in values}
    ref = str(values[0])
    if args.against_start:
        ref = "start"
        per = {ref: [run(args, values[0], s, start=True) for s in args.seeds], **per}

    def col(v: str, key: str) -> list[list[float]]:
        return [[float(t[key]) for t in tasks] for tasks in per[v]]

    for v in per:
        if [[t["task_id"] for t in ts] for ts in per[v]] != [[t["task_id"] for t in ts] for ts in per[ref]]:
            fail(f"error: {args.field}={v} was evaluated on other val tasks than {args.field}={ref}")
    result: dict[str, Any] = {
        "command": shlex.join(["python", *sys.argv]), "init": str(args.init), "field": args.field,
        "seeds": args.seeds, "iterations": args.iterations, "split": "val", "eval_episodes": args.eval_episodes,
        "env": args.base.get("env", "shop"), "env_kwargs": args.base["env_kwargs"],
        "rl": {k: v for k, v in {**args.base, **args.fixed, **({"dream": {**args.base["dream"], **args.dream_fixed}}
                                                                if args.dream_fixed else {})}.items()
               if k not in ("env", "env_kwargs")}, "reference": ref,
        "init_val_targets": seen, "values": {},
    }
    for v in per:
        entry: dict[str, Any] = {"success_rate": bootstrap_ci(col(v, "success")),
                                 "mean_reward": bootstrap_ci(col(v, "reward")),
                                 "success_per_seed": [sum(s) / len(s) for s in col(v, "success")]}
        if v != ref:
            signs = sign_test([x for s in col(v, "success") for x in s], [x for s in col(ref, "success") for x in s])
            entry["vs_reference"] = {
                "success": paired_bootstrap_ci(col(v, "success"), col(ref, "success")),
                "mean_reward": paired_bootstrap_ci(col(v, "reward"), col(ref, "reward")),
                "success_sign_test_p": signs["p"], "success_won": signs["a_better"], "success_lost": signs["b_better"]}
        result["values"][v] = entry
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for v, e in result["values"].items():
        s, r = e["success_rate"], e["mean_reward"]
        v = "start (SFT)" if v == "start" else v
        line = (f"{args.field}={v:10s} val success {s['mean']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]  "
                f"mean reward {r['mean']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]")
        if "vs_reference" in e:
            d, dr = e["vs_reference"]["success"], e["vs_reference"]["mean_reward"]
            line += (f"  vs {ref}: success {d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] "
                     f"({e['vs_reference']['success_won']} won, {e['vs_reference']['success_lost']} lost), reward "
                     f"{dr['mean']:+.3f} [{dr['ci_low']:+.3f}, {dr['ci_high']:+.3f}]")
        print(line)


if __name__ == "__main__":
    main()
