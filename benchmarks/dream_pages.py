"""How faithful the dream's own item pages were: of the synthetic transitions a bench seed's DreamGym row dreamt, the
clicks on a result link, and how many of the pages they opened show that product (its id line) and list its
options exactly (:func:`dreamgym.envs.shop.fidelity.item_options_check`), beside the dream's invalid-action rate per
iteration (``dreamgym/metrics.jsonl``).

    python benchmarks/dream_pages.py RUN/seed0 [RUN/seed1 ...] [--out FILE.json]

A results page does not show a product's options, so a dreamt item page lists them right only when M_exp copied
them from a retrieved page of the same product (or knows the catalog); a policy that answers the task's option word
on a page listing other options takes an invalid action.

``last_iteration_purchases``: the last iteration's dreamt episodes replayed in the real shop (their accepted actions,
from the same task), and of their purchases made from a dreamt item page equal to the real one, how often the
dreamt reward is the real reward within 0.1: the reward M_exp (or its reward head) gives the policy's own purchases,
with the page's own faults set apart. ``--refit-head`` adds, over every iteration's purchases, how often a reward
head fitted by the current code on the seed's offline data (what its ``train_exp`` stage would fit now) gets the
real reward of those pages, beside the dreamt rewards: a head's change measured on the policy's own purchases.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml


def seed_pages(seed_dir: Path, refit_head: bool = False) -> dict[str, Any]:
    from dreamgym.envs import make
    from dreamgym.envs.shop.env import ShopEnv
    from dreamgym.envs.shop.fidelity import click_check, item_options_check

    cfg = yaml.safe_load((seed_dir / "demo_config.yaml").read_text())
    env = make("shop", **(cfg.get("env_kwargs") or {}))
    assert isinstance(env, ShopEnv)
    clicks = same_product = options_right = 0
    with (seed_dir / "dream_buffer" / "records.jsonl").open() as f:
        for line in f:
            r = json.loads(line)
            if r["source"] != "synthetic":
                continue
            verdict = item_options_check(env.catalog, r["state"], r["action"], r["next_state"])
            if verdict is None:
                continue
            clicks += 1
            opened = click_check(r["state"], r["action"], r["next_state"])
            same_product += bool(opened and opened.ok)
            options_right += verdict.ok
    replayed = replay_purchases(env, seed_dir, last_only=True)
    refit = refit_check(env, seed_dir, int(cfg.get("seed", 0))) if refit_head else None
    metrics = [json.loads(x) for x in (seed_dir / "dreamgym" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {
        "product_clicks": clicks,
        "item_page_of_the_product": same_product / clicks if clicks else None,
        "item_options_right": options_right / clicks if clicks else None,
        "invalid_rate_by_iteration": [round(m["invalid_rate"], 4) for m in metrics if "invalid_rate" in m],
        "dreamt_success_by_iteration": [round(m["success"], 4) for m in metrics if "success" in m],
        "last_iteration_purchases": replayed,
        **({"all_iterations_purchases": refit} if refit is not None else {}),
    }


def replayed(env: Any, seed_dir: Path, last_only: bool) -> list[tuple[str, str, float, float, bool]]:
    """``(task, real page, real reward, dreamt reward, dreamt page == real page)`` of each dreamt episode that ended
    in the real shop too, replaying its accepted actions from the same task."""
    from dreamgym.types import read_trajectories

    rollouts = sorted((seed_dir / "dreamgym" / "rollouts").glob("iter_*.jsonl"))
    out = []
    for path in rollouts[-1:] if last_only else rollouts:
        for traj in read_trajectories(path):
            env.reset(seed=0, options={"task": traj.task})
            page = before = ""
            reward, ended = 0.0, False
            for x in traj.transitions:
                if x.info.get("invalid_action") or ended:  # the dream rejected it: the real shop never saw it
                    continue
                before = page
                page, reward, terminated, truncated, _ = env.step(x.action)
                ended = terminated or truncated
            last = traj.transitions[-1]
            if last.done and not last.info.get("invalid_action") and ended:
                out.append((traj.task.instruction, before, float(reward), float(last.reward), before == last.state))
    return out


def replay_purchases(env: Any, seed_dir: Path, last_only: bool) -> dict[str, Any]:
    ends = replayed(env, seed_dir, last_only)
    same = [e for e in ends if e[4]]
    return {"episodes_ended": len(ends), "from_the_real_page": len(same),
            "dreamt_reward_right": sum(abs(e[3] - e[2]) <= 0.1 for e in same) / len(same) if same else None}


def refit_check(env: Any, seed_dir: Path, seed: int) -> dict[str, Any]:
    from dreamgym.experience.reward_head import RewardHead, endings
    from dreamgym.types import read_trajectories

    head = RewardHead.fit(endings(read_trajectories(seed_dir / "offline_annotated.jsonl")), seed=seed)
    same = [e for e in replayed(env, seed_dir, last_only=False) if e[4]]
    if not same:
        return {"from_the_real_page": 0}
    predicted = head.predict_batch([(task, page) for task, page, *_ in same])
    return {"from_the_real_page": len(same),
            "dreamt_reward_right": sum(abs(e[3] - e[2]) <= 0.1 for e in same) / len(same),
            "refit_head_right": sum(abs(p - e[2]) <= 0.1 for (p, _), e in zip(predicted, same, strict=True)) / len(same),
            "always_1_right": sum(abs(1.0 - e[2]) <= 0.1 for e in same) / len(same)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed_dirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--refit-head", action="store_true", help="also score a reward head fitted by the current code")
    args = ap.parse_args(argv)
    for d in args.seed_dirs:
        if not (d / "dream_buffer" / "records.jsonl").is_file() or not (d / "dreamgym" / "metrics.jsonl").is_file():
            print(f"error: {d} holds no DreamGym row (dream_buffer/records.jsonl, dreamgym/metrics.jsonl)",
                  file=sys.stderr)
            return 2
    flags = " --refit-head" if args.refit_head else ""
    out = {"command": "python benchmarks/dream_pages.py " + " ".join(str(d) for d in args.seed_dirs) + flags,
           "seeds": {str(d): seed_pages(d, args.refit_head) for d in args.seed_dirs}}
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
