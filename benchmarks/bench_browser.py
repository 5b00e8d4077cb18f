"""The browser env on the shop site: oracle and random success through real Chromium, steps/s through the
browser vs the text shop, and a soak (memory of the env's process tree over many episodes; no stray Chromium
after close).

    .venv/bin/python benchmarks/bench_browser.py [--episodes 50] [--soak 500] [--soak-minutes 15]

The site runs in its own process (``dreamgym env serve-web shop``, the default 1,000-product shop); the env,
Playwright's driver and Chromium are this process's tree, sampled every ``--sample-every`` soak episodes (RSS
summed over the tree, the site excluded). The soak plays the noisy oracle (noise 0.3) on train tasks until
``--soak`` episodes or ``--soak-minutes``, whichever comes first (the JSON says how many it played). Writes
benchmarks/results/bench_browser.json with the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

import dreamgym
from dreamgym.collect import iter_episodes, summarize
from dreamgym.envs.base import TextEnv

RESULTS = Path(__file__).parent / "results" / "bench_browser.json"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_site(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "dreamgym", "env", "serve-web", "shop", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/config", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the shop site did not start within 120 s")


def play(env: TextEnv, policy: str, episodes: int, split: str = "test", **kwargs: Any) -> dict[str, Any]:
    start = time.perf_counter()
    trajs = list(iter_episodes(env, env.scripted_policy(policy, seed=0, **kwargs), episodes, split=split, seed=0))
    elapsed = time.perf_counter() - start
    steps = sum(t.num_steps for t in trajs)
    return {"policy": policy, "split": split, "episodes": episodes, "steps": steps, "seconds": round(elapsed, 2),
            "steps_per_s": round(steps / elapsed, 2), **summarize(trajs).to_dict()}


def tree_rss(exclude: set[int]) -> tuple[float, int]:
    """(MB of RSS summed over this process and its descendants outside ``exclude``, number of processes)."""
    me = psutil.Process()
    total, count = 0, 0
    for proc in [me, *me.children(recursive=True)]:
        if proc.pid in exclude:
            continue
        try:
            total += proc.memory_info().rss
            count += 1
        except psutil.Error:
            pass
    return total / 2**20, count


def soak(env: Any, episodes: int, minutes: float, every: int, exclude: set[int]) -> dict[str, Any]:
    policy = env.scripted_policy("noisy", seed=0, noise=0.3)
    samples: list[dict[str, float]] = []
    start = time.perf_counter()
    played = successes = steps = 0
    for traj in iter_episodes(env, policy, episodes, split="train", seed=10_000):
        played += 1
        successes += traj.success
        steps += traj.num_steps
        if played % every == 0:
            rss, procs = tree_rss(exclude)
            samples.append({"episode": played, "rss_mb": round(rss, 1), "processes": procs,
                            "seconds": round(time.perf_counter() - start, 1)})
        if time.perf_counter() - start > minutes * 60:
            break
    second = samples[len(samples) // 2:]
    slope = 0.0
    if len(second) >= 2:  # least squares: MB per 100 episodes over the second half
        xs, ys = [s["episode"] for s in second], [s["rss_mb"] for s in second]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = 100 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {"episodes_requested": episodes, "episodes_played": played, "steps": steps,
            "success_rate": round(successes / max(played, 1), 4), "seconds": round(time.perf_counter() - start, 1),
            "rss_samples": samples, "second_half_slope_mb_per_100_episodes": round(slope, 2),
            "second_half_rss_mb": [min(s["rss_mb"] for s in second), max(s["rss_mb"] for s in second)] if second else [],
            "env_stats": dict(env.stats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=50, help="test tasks per policy")
    parser.add_argument("--soak", type=int, default=500, help="soak episodes (0: no soak)")
    parser.add_argument("--soak-minutes", type=float, default=15.0, help="soak time cap")
    parser.add_argument("--sample-every", type=int, default=10, help="soak episodes between RSS samples")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still stops its site (finally below)
    port = free_port()
    site = start_site(port)
    url = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"command": shlex.join([Path(sys.executable).name, *sys.argv]),
                           "machine": {"python": platform.python_version(), "cpus": psutil.cpu_count(),
                                       "platform": platform.platform()},
                           "site": url.replace(str(port), "PORT"), "shop": "default (1,000 products)"}
    try:
        text_env = dreamgym.make("shop")
        out["text_shop"] = {p: play(text_env, p, args.episodes) for p in ("oracle", "random")}
        env = dreamgym.make("browser", start_url=url)
        out["browser"] = {p: play(env, p, args.episodes) for p in ("oracle", "random")}
        for policy in ("oracle", "random"):
            out["browser"][policy]["slowdown_vs_text_shop"] = round(
                out["text_shop"][policy]["steps_per_s"] / out["browser"][policy]["steps_per_s"], 1)
        print(json.dumps({k: out[k] for k in ("text_shop", "browser")}, indent=1), flush=True)
        if args.soak:
            out["soak"] = soak(env, args.soak, args.soak_minutes, args.sample_every, {site.pid})
        descendants = [p for p in psutil.Process().children(recursive=True) if p.pid != site.pid]
        browser_procs = [p for p in descendants if p.is_running()]
        env.close()
        time.sleep(1.0)
        stray = [p for p in browser_procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        out["close"] = {"browser_processes_before_close": len(browser_procs),
                        "stray_processes_after_close": len(stray)}
    finally:
        site.terminate()
        site.wait(timeout=30)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "soak"}, indent=1))
    if "soak" in out:
        print(json.dumps({k: v for k, v in out["soak"].items() if k != "rss_samples"}, indent=1))


if __name__ == "__main__":
    main()
