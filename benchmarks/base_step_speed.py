"""Seconds per training step of tiny bases of the same shape, forward alone and forward + backward, on one fixed
batch of random token ids: whether a base's weights (not its shape) change what a cloning step costs on the CPU.

The 600 s policy recipe took 869-909 s from the recipe-6 base made on the CPU, against 554-582 s from the shipped
base (README, "The GPU script's base, made on the CPU"); this separates the model's cost from the machine's load by
timing the bases back to back, alternating, in one process.

    python benchmarks/base_step_speed.py pretrained runs/cpu6/g6 --out F [--flush-denormal]

Measured (2026-12-05): forward + backward 0.437 s against 0.661 s a step, forward alone 0.131 against 0.109; with
--flush-denormal 0.420 against 0.422. The trained base's backward pass makes subnormal floats, which these CPUs
compute slowly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from dreamgym.llm.pretrained import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bases", nargs="+", help="'pretrained' or base directories")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=400, help="tokens per sequence")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per base and round (after one warm-up step)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, the bases alternating within each")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flush-denormal", action="store_true", help="torch.set_flush_denormal(True) first")
    ap.add_argument("--out")
    args = ap.parse_args()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    if args.flush_denormal and not torch.set_flush_denormal(True):
        ap.error("--flush-denormal: this CPU does not support it")
    for b in args.bases:
        if b != "pretrained" and not (Path(b) / "config.json").is_file():
            ap.error(f"{b}: not 'pretrained' nor a base directory (no config.json)")
    ids = torch.randint(0, 2000, (args.batch, args.length), generator=torch.Generator().manual_seed(0))
    models = {b: AutoModelForCausalLM.from_pretrained(resolve_model(b)) for b in args.bases}
    times: dict[str, dict[str, list[float]]] = {b: {"forward": [], "forward_backward": []} for b in args.bases}
    for _ in range(args.rounds):
        for base, model in models.items():
            for kind in ("forward", "forward_backward"):
                for i in range(args.steps + 1):
                    t = time.perf_counter()
                    if kind == "forward":
                        with torch.no_grad():
                            model(ids)
                    else:
                        model(ids, labels=ids).loss.backward()
                        model.zero_grad(set_to_none=True)
                    if i:  # the first step of each block warms up
                        times[base][kind].append(time.perf_counter() - t)
    result = {
        "command": "python benchmarks/base_step_speed.py " + " ".join(args.bases)
                   + f" --batch {args.batch} --length {args.length} --steps {args.steps} --rounds {args.rounds} "
                   f"--threads {args.threads}" + (" --flush-denormal" if args.flush_denormal else ""),
        "seconds_per_step_median": {b: {k: round(statistics.median(v), 4) for k, v in t.items()}
                                    for b, t in times.items()},
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
