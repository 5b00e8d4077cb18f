"""One RL iteration with rollouts served by ``dreamgym serve`` (a separate process, weights synced after every
update) against in-process rollouts, on the same model, config and seed.

    .venv/bin/python benchmarks/bench_served_rollout.py [--preset micro] [--iterations 3] [--repeats 2]

Each repeat trains ``--iterations`` GRPO iterations on the real shop twice, in-process then served, from the
same untrained ``--preset`` policy (an entropy bonus moves its weights every update). An iteration's time is ``rollout_s + update_s + sync_s`` from the run's
``metrics.jsonl`` (sync: save the safetensors and the server's ``POST /v1/load_weights``; 0 in process). Also
recorded: ``logp_behaviour_gap`` (|in-process − behaviour| log-prob before the first step: ~0 when the served
weights are the trainer's). Server and trainer share this machine's CPUs. Writes
benchmarks/results/bench_served_rollout.json with the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dreamgym.agent.policy import PolicyConfig, save_policy
from dreamgym.baselines.sft import bc_examples, init_model
from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.rl.trainer import RLConfig, train

sys.path.insert(0, str(Path(__file__).parent))
from bench_llm import free_port, start_serve

RESULTS = Path(__file__).parent / "results" / "bench_served_rollout.json"
SHOP: dict[str, Any] = {"num_products": 100, "num_tasks_per_split": 8}
KEY_ENV = "DREAMGYM_BENCH_KEY"


def start_server(model_dir: Path, port: int, threads: int) -> subprocess.Popen[bytes]:
    return start_serve(["--api-key-env", KEY_ENV, "--served-model-name", "policy", "--threads", str(threads)],
                       model_dir, port, api_key=os.environ[KEY_ENV])


def run_once(cfg: RLConfig, out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    train(cfg, out)
    wall = time.perf_counter() - t0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    iters = [m["rollout_s"] + m["update_s"] + m.get("sync_s", 0.0) for m in metrics]
    return {"iteration_s": iters, "rollout_s": [m["rollout_s"] for m in metrics],
            "update_s": [m["update_s"] for m in metrics], "sync_s": [m.get("sync_s", 0.0) for m in metrics],
            "logp_behaviour_gap": [m["logp_behaviour_gap"] for m in metrics], "run_wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="micro")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the trainer and of the server")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault(KEY_ENV, "bench-key")
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        env = make("shop", **SHOP)
        trajs = list(iter_episodes(env, env.scripted_policy("oracle"), 8, seed=0))
        pcfg = PolicyConfig(max_new_tokens=16, action_format="index")
        model, tokenizer = init_model(args.preset, trajs, bc_examples(trajs, pcfg), vocab_size=1024, seed=0)
        params = sum(p.numel() for p in model.parameters())
        save_policy(tmp / "init", model, tokenizer, pcfg)
        base: dict[str, Any] = {
            "init": str(tmp / "init"), "env": "shop", "env_kwargs": SHOP, "iterations": args.iterations,
            "tasks_per_iter": args.tasks, "group_size": args.group_size, "max_steps": args.max_steps, "lr": 1e-3,
            "entropy_coef": 0.01,  # moves the weights every update even when all returns tie (untrained policy)
            "minibatch_size": 1000, "micro_batch_size": 16, "eval_episodes": 0, "save_every": args.iterations,
            "num_threads": args.threads, "save_rollouts": False, "seed": 0,
        }
        runs: dict[str, list[dict[str, Any]]] = {"in_process": [], "served": []}
        for r in range(args.repeats):
            runs["in_process"].append(run_once(RLConfig.model_validate(base), tmp / f"inproc{r}"))
            port = free_port()
            server = start_server(tmp / "init" / "model", port, args.threads)  # fresh: serves the initial weights
            try:
                served = {**base, "rollout_server": {"base_url": f"http://127.0.0.1:{port}/v1", "model": "policy",
                                                     "api_key_env": KEY_ENV}}
                runs["served"].append(run_once(RLConfig.model_validate(served), tmp / f"served{r}"))
            finally:
                server.terminate()
                server.wait(timeout=30)

    def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
        flat = {k: [v for row in rows for v in row[k]] for k in ("iteration_s", "rollout_s", "update_s", "sync_s")}
        out = {f"mean_{k}": round(float(np.mean(v)), 3) for k, v in flat.items()}
        out["max_logp_behaviour_gap"] = float(max(g for row in rows for g in row["logp_behaviour_gap"]))
        return out

    result = {
        "command": shlex.join([".venv/bin/python", *sys.argv]),
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                    "threads": args.threads, "processor": platform.machine()},
        "policy": f"untrained {args.preset}", "parameters": params, "shop": SHOP,
        "tasks_per_iter": args.tasks, "group_size": args.group_size, "max_steps": args.max_steps,
        "iterations": args.iterations, "repeats": args.repeats,
        "in_process": summary(runs["in_process"]), "served": summary(runs["served"]),
        "runs": runs,
    }
    result["served_over_in_process"] = round(result["served"]["mean_iteration_s"]
                                             / result["in_process"]["mean_iteration_s"], 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("in_process", "served", "served_over_in_process")}, indent=2))


if __name__ == "__main__":
    main()
