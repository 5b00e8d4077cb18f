"""Steps per second of the real text envs (ScienceWorld, TextWorld), one env vs a pool, and a soak run.

    .venv/bin/python benchmarks/bench_text_envs.py [--seconds 20] [--workers 2] [--soak-episodes 2000]

Throughput: a uniform random policy over the admissible actions steps ``LocalEnvPool(1)`` (one env in this
process) and ``RayEnvPool(workers)`` (one env per Ray actor process, stepped as one batch) for ``--seconds``
each, episodes reset as they end. ScienceWorld runs with ``admissible=True`` (the simulator's valid-action
search every step) and ``admissible=False`` (the menu from the room text). TextWorld always computes its
admissible commands (the game needs them to tell an invalid command), so it has one row.

Soak: ``--soak-episodes`` random-policy ScienceWorld episodes (``admissible=False``) across a
``RayEnvPool(workers)``, then ``close()``; reports the RSS of this process tree (this process, Ray's
processes, the JVMs) before, at the end and after close, and the stray JVM / game processes left
(should be 0). Writes ``benchmarks/results/bench_text_envs.json`` with the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from dreamgym.envs.pool import EnvPool, LocalEnvPool, RayEnvPool, env_factory

RESULTS = Path(__file__).parent / "results" / "bench_text_envs.json"


def stray_jvms() -> list[int]:
    """ScienceWorld JVMs on this machine (the soak counts the ones left beyond those present before)."""
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "java" in cmdline and "scienceworld" in cmdline:
            pids.append(proc.info["pid"])
    return pids


def tree_rss_mb() -> float:
    """RSS of this process and all its descendants, plus the Ray processes and the JVMs (in MB)."""
    me = psutil.Process()
    procs = {me.pid: me, **{p.pid: p for p in me.children(recursive=True)}}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "ray::" in cmdline or "scienceworld" in cmdline or "ray/core" in cmdline:
            procs.setdefault(proc.info["pid"], proc)
    total = 0
    for proc in procs.values():
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return round(total / 2**20, 1)


def run_random(pool: EnvPool, seconds: float | None, episodes: int | None, seed: int = 0) -> dict[str, Any]:
    """Step every slot with random admissible actions for ``seconds`` or until ``episodes`` have ended."""
    rng = random.Random(seed)
    tasks = pool.tasks("train")
    slots = list(range(pool.num_envs))
    started = pool.reset_batch(slots, [rng.choice(tasks) for _ in slots], [seed + i for i in slots], "train")
    actions_of = [info["admissible_actions"] for _, info in started]
    steps = done_episodes = 0
    start = time.perf_counter()
    while (seconds is None or time.perf_counter() - start < seconds) and (episodes is None or done_episodes < episodes):
        actions = [rng.choice(a) if a else "look around" for a in actions_of]
        results = pool.step_batch(slots, actions)
        steps += len(results)
        ended = [i for i, r in enumerate(results) if r.terminated or r.truncated]
        for i, r in enumerate(results):
            actions_of[i] = r.info["admissible_actions"]
        if ended:
            done_episodes += len(ended)
            resets = pool.reset_batch(ended, [rng.choice(tasks) for _ in ended], [seed + steps + i for i in ended], "train")
            for i, (_, info) in zip(ended, resets, strict=True):
                actions_of[i] = info["admissible_actions"]
    elapsed = time.perf_counter() - start
    return {"steps": steps, "episodes": done_episodes, "seconds": round(elapsed, 2), "steps_per_s": round(steps / elapsed, 1)}


def throughput(name: str, kwargs: dict[str, Any], seconds: float, workers: int) -> dict[str, Any]:
    factory = env_factory(name, **kwargs)
    row: dict[str, Any] = {"env": name, "kwargs": kwargs}
    single = LocalEnvPool(factory, 1)
    try:
        row["single"] = run_random(single, seconds, None)
    finally:
        single.close()
    pooled = RayEnvPool(factory, workers, num_cpus=workers)
    try:
        row[f"ray_{workers}"] = run_random(pooled, seconds, None)
    finally:
        pooled.close()
    row["speedup"] = round(row[f"ray_{workers}"]["steps_per_s"] / row["single"]["steps_per_s"], 2)
    print(json.dumps(row), flush=True)
    return row


def soak(episodes: int, workers: int, tasks: str) -> dict[str, Any]:
    jvms_before = set(stray_jvms())
    factory = env_factory("scienceworld", task=tasks, admissible=False, max_variations=20)
    pool = RayEnvPool(factory, workers, num_cpus=workers)
    rss_start = tree_rss_mb()
    half = run_random(pool, None, episodes // 2, seed=1)
    rss_half = tree_rss_mb()
    rest = run_random(pool, None, episodes - half["episodes"], seed=2)
    rss_end = tree_rss_mb()
    pool.close()
    time.sleep(3)  # actors killed: their JVMs see stdin close and exit
    left = sorted(set(stray_jvms()) - jvms_before)
    result = {
        "episodes": half["episodes"] + rest["episodes"], "steps": half["steps"] + rest["steps"],
        "seconds": round(half["seconds"] + rest["seconds"], 1), "workers": workers, "tasks": tasks,
        "rss_mb": {"pool_started": rss_start, "half_way": rss_half, "end": rss_end, "after_close": tree_rss_mb()},
        "stray_jvms_after_close": len(left),
    }
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="measuring time per configuration")
    parser.add_argument("--workers", type=int, default=2, help="Ray env actors in the pooled runs")
    parser.add_argument("--soak-episodes", type=int, default=2000, help="0 skips the soak run")
    parser.add_argument("--sw-tasks", default="find-living-thing,lifespan-longest-lived,chemistry-mix-paint-secondary-color")
    parser.add_argument("--tw-cache", default=None, help="TextWorld game cache (default: a temp dir)")
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    tw_cache = args.tw_cache or tempfile.mkdtemp(prefix="bench-tw-")
    configs: list[tuple[str, dict[str, Any]]] = [
        ("scienceworld", {"task": args.sw_tasks, "admissible": True, "max_variations": 5}),
        ("scienceworld", {"task": args.sw_tasks, "admissible": False, "max_variations": 5}),
        ("textworld", {"num_train_games": 4, "num_test_games": 1, "cache_dir": tw_cache}),
    ]
    tw_name, tw_kwargs = configs[2]
    LocalEnvPool(env_factory(tw_name, **tw_kwargs), 1).close()  # generate the games once, untimed
    rows = [throughput(name, kwargs, args.seconds, args.workers) for name, kwargs in configs]
    result: dict[str, Any] = {"command": " ".join([".venv/bin/python", *sys.argv]), "throughput": rows}
    if args.soak_episodes > 0:
        result["soak"] = soak(args.soak_episodes, args.workers, args.sw_tasks)
    ray.shutdown()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
