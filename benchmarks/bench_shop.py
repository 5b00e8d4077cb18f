"""Shop env throughput and build cost: catalog + BM25 index build time per catalog size, and env steps/s
under the oracle, noisy and random policies, measured side by side in one run.

    .venv/bin/python benchmarks/bench_shop.py [--sizes 1000,100000] [--episodes 300]

Prints a table and writes benchmarks/results/bench_shop_env.json (with the command that produced it).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from dreamgym.collect import iter_episodes, summarize
from dreamgym.envs.shop import SearchEngine, ShopEnv, build_catalog, build_tasks

RESULTS = Path(__file__).parent / "results" / "bench_shop_env.json"


def bench_build(num_products: int) -> dict[str, Any]:
    """Uncached build times: catalog generation, BM25 index, 2 x 2,000 tasks."""
    build_catalog.cache_clear()
    build_tasks.cache_clear()
    start = time.perf_counter()
    catalog = build_catalog(num_products, 0)  # cached from here on, so the tasks reuse it
    built = time.perf_counter()
    SearchEngine(catalog)
    indexed = time.perf_counter()
    for split in ("train", "test"):
        build_tasks(num_products, 0, split, 2000, 0.2)
    tasks = time.perf_counter()
    return {
        "num_products": num_products,
        "catalog_s": round(built - start, 3),
        "index_s": round(indexed - built, 3),
        "tasks_s": round(tasks - indexed, 3),
        "total_s": round(tasks - start, 3),
    }


def bench_policy(env: ShopEnv, policy: str, episodes: int) -> dict[str, Any]:
    start = time.perf_counter()
    trajs = list(iter_episodes(env, env.scripted_policy(policy, seed=0), episodes, split="test", seed=0))
    elapsed = time.perf_counter() - start
    result = summarize(trajs)
    steps = sum(t.num_steps for t in trajs)
    return {
        "num_products": env.num_products,
        "policy": policy,
        "episodes": episodes,
        "steps": steps,
        "steps_per_s": round(steps / elapsed, 1),
        "episodes_per_s": round(episodes / elapsed, 1),
        "success_rate": result.success_rate,
        "mean_reward": round(result.mean_reward, 4),
        "mean_steps": round(result.mean_steps, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000", help="comma-separated catalog sizes")
    parser.add_argument("--episodes", type=int, default=300, help="test episodes per policy and size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    builds = [bench_build(n) for n in sizes]
    print(f"{'products':>9} {'catalog s':>10} {'index s':>8} {'tasks s':>8} {'total s':>8}")
    for b in builds:
        print(f"{b['num_products']:>9} {b['catalog_s']:>10.2f} {b['index_s']:>8.2f} {b['tasks_s']:>8.2f} {b['total_s']:>8.2f}")

    runs = []
    for n in sizes:
        env = ShopEnv(num_products=n)
        runs += [bench_policy(env, policy, args.episodes) for policy in ("oracle", "noisy", "random")]
    print(f"\n{'products':>9} {'policy':>7} {'steps/s':>8} {'episodes/s':>10} {'success':>8} {'reward':>7} {'steps':>6}")
    for r in runs:
        print(
            f"{r['num_products']:>9} {r['policy']:>7} {r['steps_per_s']:>8.0f} {r['episodes_per_s']:>10.1f} "
            f"{r['success_rate']:>8.3f} {r['mean_reward']:>7.3f} {r['mean_steps']:>6.2f}"
        )

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/bench_shop.py", *sys.argv[1:]]),
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
        "build": builds,
        "policies": runs,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
