"""The GPU check: dreamgym's CUDA paths in one run of a few minutes, written to one JSON file.

    python benchmarks/gpu_check.py --out gpu_check.json                        # CUDA, bf16, a few-M-param model
    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/check.json  # fp32, tiny sizes (CI-sized)

Each check runs on its own (a failure is recorded with its one-line error and the next check runs; the exit
status is 1 when any failed):

* ``hf_generate``: the ``hf`` backend (``HFLLM``) generating a batch, greedy; tokens/s;
* ``train_exp``: ``train_experience_model`` (M_exp SFT through the HF Trainer; bf16 on CUDA) on rule-annotated
  shop episodes; target tokens/s of training;
* ``rl_trainer``: ``dreamgym.rl.trainer.train`` (GRPO on the real shop) with ``RLConfig.device``/``dtype``:
  the rollouts' generation tokens/s, the update's seconds;
* ``distributed_update``: one :class:`~dreamgym.rl.learner.Learner` update through an ``accelerate``
  ``Accelerator`` at world size 1 (process group: NCCL on CUDA, gloo on the CPU) against the same update
  without accelerate (largest parameter difference); training tokens/s and one ``all_reduce`` on the group;
* ``dream``: dream steps/s (``DreamEnvPool`` over M_exp) at batch 1 / 64 / 256 (``--quick``: 1 / 4 / 8).

Sized for under 10 minutes on one GPU (an H200: about 2 minutes are model setup and tokenizer training on the
CPU). The GPU image may lack pydantic, gymnasium and tensorboard: run ``bash benchmarks/gpu/check_wheels.sh``
here and install ``.whl/*.whl`` there first (``pip install --no-deps .whl/*.whl``). tests/test_gpu_check.py runs
the ``--device cpu --quick`` mode.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dreamgym.agent.policy import PolicyConfig, load_policy, save_policy
from dreamgym.baselines.sft import bc_examples, init_model
from dreamgym.collect import iter_episodes
from dreamgym.envs import make
from dreamgym.experience.annotate import RuleAnnotator
from dreamgym.experience.protocol import ProtocolConfig
from dreamgym.llm import SamplingParams
from dreamgym.sft import SFTConfig
from dreamgym.types import Trajectory, write_jsonl

SHOP: dict[str, Any] = {"num_products": 200, "num_tasks_per_split": 20}


def sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"preset": "micro", "episodes": 6, "gen_batch": 8, "gen_tokens": 16, "exp_steps": 2, "exp_batch": 4,
                "rl_iterations": 1, "rl_tasks": 2, "rl_group": 2, "rl_steps": 2, "dream_batches": [1, 4, 8],
                "dream_steps": 1, "dream_tokens": 16, "max_new_tokens": 8}
    return {"preset": "small", "episodes": 60, "gen_batch": 64, "gen_tokens": 64, "exp_steps": 200, "exp_batch": 32,
            "rl_iterations": 3, "rl_tasks": 8, "rl_group": 8, "rl_steps": 5, "dream_batches": [1, 64, 256],
            "dream_steps": 4, "dream_tokens": 64, "max_new_tokens": 16}


def machine(device: str) -> dict[str, Any]:
    import accelerate
    import transformers

    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "cpus": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
                           "accelerate": accelerate.__version__, "device": device}
    if device.startswith("cuda"):
        out.update({"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
                    "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)})
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def check_hf_generate(ctx: dict[str, Any]) -> dict[str, Any]:
    from dreamgym.llm.hf import HFLLM

    s, device = ctx["sizes"], ctx["device"]
    llm = HFLLM.from_pretrained(ctx["policy_run"] / "model", device=device, dtype=ctx["dtype"],
                                max_batch_size=s["gen_batch"])
    rng = random.Random(0)
    prompts = [f"TASK: buy item {rng.randrange(1000)} in red" for _ in range(s["gen_batch"])]
    params = SamplingParams(max_new_tokens=s["gen_tokens"], temperature=0.0)
    llm.generate(prompts[:2], params)  # warm-up (CUDA kernels, allocator)
    sync(device)
    t0 = time.perf_counter()
    done = llm.generate(prompts, params)
    sync(device)
    seconds = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for c in done)
    return {"batch": len(prompts), "generated_tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 1), "model_device": str(llm.device),
            "model_dtype": str(next(llm.model.parameters()).dtype)}


def check_train_exp(ctx: dict[str, Any]) -> dict[str, Any]:
    from dreamgym.experience.train import train_experience_model

    s = ctx["sizes"]
    sft = SFTConfig(max_steps=s["exp_steps"], batch_size=s["exp_batch"], max_length=768, num_threads=ctx["threads"],
                    save_steps=10**6, logging_steps=10**6, bf16=ctx["dtype"] == "bfloat16")
    summary = train_experience_model([ctx["data"]], s["preset"], ctx["tmp"] / "exp", ctx["protocol"], sft,
                                     vocab_size=1024)
    tokens = (summary["prompt_tokens"] + summary["target_tokens"]) * summary["epochs"]
    return {k: summary[k] for k in ("params", "examples", "steps", "epochs", "train_loss", "seconds")} | {
        "trained_tokens": int(tokens), "train_tokens_per_s": round(tokens / max(summary["seconds"], 1e-9), 1),
        "bf16": sft.bf16, "cuda_used": torch.cuda.is_available() and ctx["device"].startswith("cuda")}


def rl_config(ctx: dict[str, Any], **extra: Any) -> Any:
    from dreamgym.rl.config import RLConfig

    s = ctx["sizes"]
    return RLConfig.model_validate({
        "init": str(ctx["policy_run"]), "env": "shop", "env_kwargs": SHOP, "iterations": s["rl_iterations"],
        "tasks_per_iter": s["rl_tasks"], "group_size": s["rl_group"], "max_steps": s["rl_steps"], "lr": 1e-4,
        "minibatch_size": 64, "micro_batch_size": 16, "eval_episodes": 0, "save_every": s["rl_iterations"],
        "num_threads": ctx["threads"], "save_rollouts": False, "device": ctx["device"], "dtype": ctx["dtype"],
        **extra})


def check_rl_trainer(ctx: dict[str, Any]) -> dict[str, Any]:
    from dreamgym.rl.trainer import train

    run = ctx["tmp"] / "rl"
    t0 = time.perf_counter()
    summary = train(rl_config(ctx), run)
    wall = time.perf_counter() - t0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {"iterations": summary["iterations"], "real_transitions": summary["real_transitions"],
            "wall_s": round(wall, 2), "generation_tokens_per_s": [round(m["tokens_per_s"], 1) for m in metrics],
            "rollout_s": [round(m["rollout_s"], 3) for m in metrics],
            "update_s": [round(m["update_s"], 3) for m in metrics],
            "saved_dtype": str(next(load_policy(run).llm.model.parameters()).dtype)}  # type: ignore[attr-defined]


def check_distributed_update(ctx: dict[str, Any]) -> dict[str, Any]:
    """One Learner update through accelerate at world size 1 vs without it, on the same rows and rng."""
    import numpy as np
    import torch.distributed as tdist
    from accelerate import Accelerator

    from dreamgym.envs.pool import LocalEnvPool, env_factory
    from dreamgym.rl.batch import grpo_advantages, turn_rows
    from dreamgym.rl.distributed import Dist
    from dreamgym.rl.learner import Learner
    from dreamgym.rl.rollout import collect_rollouts

    device, cfg = ctx["device"], rl_config(ctx, ppo_epochs=1)
    cuda = device.startswith("cuda")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "LOCAL_RANK": "0",
                       "WORLD_SIZE": "1"})
    if not tdist.is_initialized():
        tdist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1,
                                 device_id=torch.device(device if ":" in device else f"{device}:0") if cuda else None)
    accelerator = Accelerator(cpu=not cuda)
    policy = load_policy(ctx["policy_run"], device=str(accelerator.device), dtype=ctx["dtype"])
    policy.cfg = policy.cfg.model_copy(update={"temperature": 1.0, "top_p": 1.0})
    s = ctx["sizes"]
    pool = LocalEnvPool(env_factory("shop", **SHOP), s["rl_tasks"] * s["rl_group"])
    tasks = pool.tasks("train")[: s["rl_tasks"]]
    episodes = collect_rollouts(pool, policy, tasks, s["rl_group"], s["rl_steps"], seed=0)
    pool.close()
    rows = turn_rows(episodes)
    grpo_advantages(episodes, rows, True, "token", "episode")
    for k, r in enumerate(rows):  # distinct advantages, so the update moves the weights even when returns tie
        r.advantage = 1.0 if k % 2 else -1.0
    tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    plain = load_policy(ctx["policy_run"], device=device, dtype=ctx["dtype"])
    plain.cfg = policy.cfg
    before = {k: v.detach().clone() for k, v in plain.llm.model.state_dict().items()}  # type: ignore[attr-defined]
    Learner(plain, cfg, dist=Dist(device=device)).update(rows, np.random.default_rng(0))
    learner = Learner(policy, cfg, dist=Dist(accelerator))
    sync(device)
    t0 = time.perf_counter()
    learner.update(rows, np.random.default_rng(0))
    sync(device)
    seconds = time.perf_counter() - t0
    a = policy.llm.model.state_dict()  # type: ignore[attr-defined]
    b = plain.llm.model.state_dict()  # type: ignore[attr-defined]
    diff = max((a[k].float() - b[k].float().to(a[k].device)).abs().max().item() for k in b)
    moved = max((b[k].float() - before[k].float()).abs().max().item() for k in b)
    probe = torch.ones(1, device=accelerator.device)
    tdist.all_reduce(probe)
    return {"distributed_type": str(accelerator.distributed_type), "backend": tdist.get_backend(),
            "world_size": tdist.get_world_size(), "wrapped": type(learner.train_model).__name__,
            "rows": len(rows), "tokens": tokens, "update_s": round(seconds, 3),
            "train_tokens_per_s": round(tokens / seconds, 1), "max_param_diff_vs_plain": diff,
            "max_param_change": moved, "all_reduce_sum": probe.item()}


def check_dream(ctx: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_dream import ForwardTimer, run_pool

    from dreamgym.experience.dream import InitialStates
    from dreamgym.experience.model import ExperienceConfig, ExperienceModel

    s, device = ctx["sizes"], ctx["device"]
    exp_dir = ctx["tmp"] / "exp"
    if not (exp_dir / "experience.json").exists():
        raise RuntimeError("no M_exp: the train_exp check failed")
    cfg = ExperienceConfig.from_protocol(ctx["protocol"], max_new_tokens=s["dream_tokens"], max_resamples=0)
    model = ExperienceModel.load(exp_dir, cfg=cfg, device=device)
    lm: Any = model.llm.model  # type: ignore[attr-defined]
    if ctx["dtype"] == "bfloat16":
        lm.to(torch.bfloat16)
    timer = ForwardTimer(lm)
    trajs: list[Trajectory] = ctx["trajs"]
    initial = InitialStates.from_trajectories(trajs)
    tasks = [t.task for t in trajs]
    out: dict[str, Any] = {"max_new_tokens": s["dream_tokens"]}
    for b in s["dream_batches"]:
        r = run_pool(model, timer, b, s["dream_steps"], seed=0, initial=initial, tasks=tasks)
        out[str(b)] = {"steps": r["steps"], "seconds": round(r["seconds"], 3),
                       "steps_per_s": round(r["steps"] / r["seconds"], 2),
                       "outside_forward_share": round(1 - r["forward_seconds"] / r["seconds"], 3)}
    return out


CHECKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "hf_generate": check_hf_generate, "train_exp": check_train_exp, "rl_trainer": check_rl_trainer,
    "distributed_update": check_distributed_update, "dream": check_dream,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    ap.add_argument("--device", default="cuda", help="cuda (bf16) or cpu (fp32)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (the CPU test)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--only", nargs="+", choices=list(CHECKS), help="run these checks only")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no GPU (use --device cpu --quick on a CPU)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result: dict[str, Any] = {"command": shlex.join(["python", "benchmarks/gpu_check.py", *(argv or sys.argv[1:])]),
                              "machine": machine(args.device), "quick": args.quick, "checks": {}}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        s = sizes(args.quick)
        t0 = time.perf_counter()
        env = make("shop", **SHOP)
        trajs = list(iter_episodes(env, env.scripted_policy("noisy", seed=0, noise=0.3), s["episodes"],
                                   split="train", seed=0))
        annotated = RuleAnnotator().annotate(trajs)
        write_jsonl(tmp / "data.jsonl", annotated)
        pcfg = PolicyConfig(max_new_tokens=s["max_new_tokens"], action_format="index")
        model, tokenizer = init_model(s["preset"], trajs, bc_examples(trajs, pcfg), vocab_size=1024, seed=0)
        save_policy(tmp / "policy", model, tokenizer, pcfg)
        result["setup_s"] = round(time.perf_counter() - t0, 2)
        result["policy_params"] = sum(p.numel() for p in model.parameters())
        ctx = {"device": args.device, "dtype": "bfloat16" if args.device.startswith("cuda") else "float32",
               "sizes": s, "tmp": tmp, "threads": args.threads, "policy_run": tmp / "policy",
               "data": tmp / "data.jsonl", "trajs": annotated,
               "protocol": ProtocolConfig(k=0, neighbour_states=False, system_prompt="", history_window=2)}
        result["dtype"] = ctx["dtype"]
        for name, check in CHECKS.items():
            if args.only and name not in args.only:
                continue
            t0 = time.perf_counter()
            try:
                entry = {"ok": True, **check(ctx)}
            except Exception as e:  # recorded; the next check still runs
                entry = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                         "traceback": traceback.format_exc(limit=4)}
            entry["check_s"] = round(time.perf_counter() - t0, 2)
            result["checks"][name] = entry
            print(f"{name}: {'ok' if entry['ok'] else 'FAILED ' + entry['error']} ({entry['check_s']} s)", flush=True)
    result["total_s"] = round(time.perf_counter() - started, 2)
    result["ok"] = all(c["ok"] for c in result["checks"].values())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
