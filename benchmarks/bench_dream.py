"""Dream steps per second at batch 1 vs 64, and the share of step time spent outside model forward passes.

    .venv/bin/python benchmarks/bench_dream.py --model runs/exp/main [--buffer DIR] [--steps 4] [--batches 1 64]

A ``DreamEnvPool`` of B episodes (shop tasks, the shop's action grammar, no buffer writes) is stepped with
random admissible actions; every pool step is one batched ``ExperienceModel.predict``. Forward passes of the
model (prefill and every decode step) are timed with torch forward hooks on the model itself, so
``outside_forward_share`` = 1 − forward time / step time is everything else: prompt building, tokenisation,
sampling, KV-cache bookkeeping, parsing, the grammar, the env objects (goal: ≤ 10%). The batch sizes run
interleaved in one process so that a load spike hits both alike. Without ``--model`` an untrained ``small``
model (tokenizer trained on the data) is used with ``--max-new-tokens``: it never stops early, so its steps/s
is a lower bound. ``--buffer`` attaches a replay buffer (read-only) so that a model with k > 0 retrieves its
neighbours as in the dream (retrieval then counts as time outside forward passes). Writes ``benchmarks/results/bench_dream.json`` with the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dreamgym.envs import make
from dreamgym.experience.dream import DreamEnv, DreamEnvPool, InitialStates
from dreamgym.experience.model import ExperienceConfig, ExperienceModel
from dreamgym.experience.protocol import ProtocolConfig
from dreamgym.experience.train import exp_examples, fresh_tiny_model, read_training_data
from dreamgym.replay import ReplayBuffer

RESULTS = Path(__file__).parent / "results" / "bench_dream.json"


class ForwardTimer:
    """Accumulates wall time spent inside ``module.forward`` (forward pre/post hooks on the top module)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._t0 = 0.0
        module.register_forward_pre_hook(self._start)
        module.register_forward_hook(self._stop)

    def _start(self, *_: Any) -> None:
        self._t0 = time.perf_counter()

    def _stop(self, *_: Any) -> None:
        self.seconds += time.perf_counter() - self._t0
        self.calls += 1


def load_model(args: argparse.Namespace, workdir: Path) -> ExperienceModel:
    if args.model:
        return ExperienceModel.load(args.model)
    trajs = read_training_data(args.data)[:200]
    protocol = ProtocolConfig(k=0, neighbour_states=False, system_prompt="", history_window=2)
    lm, tokenizer = fresh_tiny_model("small", trajs, exp_examples(trajs, protocol), None, seed=0)
    lm.save_pretrained(workdir / "untrained")
    tokenizer.save_pretrained(workdir / "untrained")
    cfg = ExperienceConfig.from_protocol(protocol, max_new_tokens=args.max_new_tokens, max_resamples=0)
    return ExperienceModel.load(workdir / "untrained", cfg=cfg)


def run_pool(model: ExperienceModel, timer: ForwardTimer, batch: int, steps: int, seed: int,
             initial: InitialStates, tasks: list[Any]) -> dict[str, float]:
    """Reset ``batch`` dream episodes and advance them ``steps`` pool steps; time and forward share."""
    shop = make("shop", num_products=1000)
    rng = random.Random(seed)
    pool = DreamEnvPool(lambda: DreamEnv(model, {"test": tasks}, initial, grammar=shop), batch, add_to_buffer=False)
    obs = pool.reset_batch(range(batch), [tasks[(seed + i) % len(tasks)] for i in range(batch)],
                           [seed + i for i in range(batch)], "test")
    infos = [info for _, info in obs]
    done_steps, t_total, t_forward = 0, 0.0, 0.0
    for _ in range(steps):
        actions = [rng.choice(info.get("admissible_actions") or ["click[back to search]"]) for info in infos]
        f0, t0 = timer.seconds, time.perf_counter()
        results = pool.step_batch(range(batch), actions)
        t_total += time.perf_counter() - t0
        t_forward += timer.seconds - f0
        done_steps += batch
        infos = []
        for i, r in enumerate(results):
            if r.terminated or r.truncated:  # start a new episode in that slot (not timed)
                _, info = pool.reset_batch([i], [tasks[rng.randrange(len(tasks))]], [rng.randrange(10**6)], "test")[0]
                infos.append(info)
            else:
                infos.append(r.info)
    return {"steps": done_steps, "seconds": t_total, "forward_seconds": t_forward}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="experience-model directory (default: an untrained small model)")
    parser.add_argument("--data", nargs="+", default=["data/exp/heldout.jsonl"], help="trajectories: initial states")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--steps", type=int, default=4, help="pool steps per repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=256, help="untrained model only")
    parser.add_argument("--buffer", type=Path, help="replay buffer to retrieve from (a model with k > 0)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(args, Path(tmp))
        if args.buffer is not None:
            model.buffer = ReplayBuffer.open(args.buffer, create=False, read_only=True)
        lm = getattr(model.llm, "model", None)
        if not isinstance(lm, torch.nn.Module):
            raise SystemExit("bench_dream needs the hf backend (a local model)")
        timer = ForwardTimer(lm)
        trajs = read_training_data(args.data)
        initial = InitialStates.from_trajectories(trajs)
        tasks = [t.task for t in trajs]
        runs: dict[int, list[dict[str, float]]] = {b: [] for b in args.batches}
        for rep in range(args.repeats):
            for b in args.batches:
                runs[b].append(run_pool(model, timer, b, args.steps, seed=rep, initial=initial, tasks=tasks))
                last = runs[b][-1]
                print(f"batch {b:3d} repeat {rep}: {last['steps'] / last['seconds']:.2f} steps/s, "
                      f"outside forward {1 - last['forward_seconds'] / last['seconds']:.1%}", flush=True)

    results: dict[str, Any] = {}
    for b, rs in runs.items():
        results[str(b)] = {
            "steps_per_s": round(statistics.median(r["steps"] / r["seconds"] for r in rs), 3),
            "outside_forward_share": round(statistics.median(1 - r["forward_seconds"] / r["seconds"] for r in rs), 4),
            "steps": sum(r["steps"] for r in rs),
        }
    lo, hi = min(args.batches), max(args.batches)
    out = {
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "model": args.model or f"untrained small, max_new_tokens={args.max_new_tokens}",
        "buffer": str(args.buffer) if args.buffer else None,
        "threads": args.threads,
        "by_batch": results,
        "speedup": round(results[str(hi)]["steps_per_s"] / results[str(lo)]["steps_per_s"], 2),
        "parse": model.stats_dict(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
