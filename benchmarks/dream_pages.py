"""How faithful the dream's own item pages were: of the synthetic transitions a bench seed's DreamGym row dreamt, the
clicks on a result link, and how many of the pages they opened show that product (its id line) and list its
options exactly (:func:`dreamgym.envs.shop.fidelity.item_options_check`), beside the dream's invalid-action rate per
iteration (``dreamgym/metrics.jsonl``).

    python benchmarks/dream_pages.py RUN/seed0 [RUN/seed1 ...] [--out FILE.json]

A results page does not show a product's options, so a dreamt item page lists them right only when M_exp copied
them from a retrieved page of the same product (or knows the catalog); a policy that answers the task's option word
on a page listing other options takes an invalid action.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml


def seed_pages(seed_dir: Path) -> dict[str, Any]:
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
    metrics = [json.loads(x) for x in (seed_dir / "dreamgym" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {
        "product_clicks": clicks,
        "item_page_of_the_product": same_product / clicks if clicks else None,
        "item_options_right": options_right / clicks if clicks else None,
        "invalid_rate_by_iteration": [round(m["invalid_rate"], 4) for m in metrics if "invalid_rate" in m],
        "dreamt_success_by_iteration": [round(m["success"], 4) for m in metrics if "success" in m],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed_dirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    for d in args.seed_dirs:
        if not (d / "dream_buffer" / "records.jsonl").is_file() or not (d / "dreamgym" / "metrics.jsonl").is_file():
            print(f"error: {d} holds no DreamGym row (dream_buffer/records.jsonl, dreamgym/metrics.jsonl)",
                  file=sys.stderr)
            return 2
    out = {"command": "python benchmarks/dream_pages.py " + " ".join(str(d) for d in args.seed_dirs),
           "seeds": {str(d): seed_pages(d) for d in args.seed_dirs}}
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
