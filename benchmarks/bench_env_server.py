"""Shop steps/s: in process vs over HTTP (our AgentGym server + client), 1 and 8 client threads.

Run: .venv/bin/python /tmp/srvbench/bench_env_server.py [--steps 600] [--out /tmp/srvbench/result.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from dreamgym.envs import make
from dreamgym.envs.agentgym import AgentGymEnv
from dreamgym.envs.base import RandomPolicy, TextEnv
from dreamgym.envs.server import BackgroundServer, create_app


def run(env: TextEnv, steps: int, seed: int) -> int:
    policy, done, n = RandomPolicy(seed), True, 0
    tasks = env.tasks("test")
    obs, info = "", {}
    while n < steps:
        if done:
            obs, info = env.reset(seed=seed + n, options={"task": tasks[n % len(tasks)]})
        obs, _, term, trunc, info = env.step(policy.act(obs, info))
        done, n = term or trunc, n + 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--out", default="/tmp/srvbench/result.json")
    args = ap.parse_args()
    local = make("shop")
    t = time.perf_counter()
    run(local, args.steps, 0)
    in_process = args.steps / (time.perf_counter() - t)
    out = {"command": " ".join([sys.executable, *sys.argv]), "steps": args.steps, "in_process_steps_s": in_process}
    with BackgroundServer(create_app("shop")) as url:
        for threads in (1, 8):
            envs = [AgentGymEnv(url=url, env_name="shop") for _ in range(threads)]
            per = args.steps // threads
            workers = [threading.Thread(target=run, args=(e, per, i)) for i, e in enumerate(envs)]
            t = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            rate = per * threads / (time.perf_counter() - t)
            out[f"http_{threads}_clients_steps_s"] = rate
            out[f"http_{threads}_clients_over_in_process"] = rate / in_process
            for e in envs:
                e.close()
    print(json.dumps(out, indent=2))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
