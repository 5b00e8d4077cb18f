"""The bench's SFT warm start alone, for choosing its settings on val: no test evaluation.

    python benchmarks/sft_val.py --config configs/shop-bench-policy.yaml --seed 0 \
        --offline runs/bench_pb/seed0/offline.jsonl [--collect] [--set bc_final_repeat=12 ...] --out RUN
    python benchmarks/policy_diag.py RUN --split val --episodes 200 --option-data data/opt/val500.jsonl

Trains exactly what the demo's ``sft`` stage trains (``dreamgym.pipeline``: ``train_bc`` on the seed's offline data
with the config's policy model, SFT, policy format, decision, on-path and final-step settings) into ``RUN``, and
writes ``RUN/sft_val.json`` with the command and the config fields it used. With ``--collect``, a missing ``--offline``
file is first made as the bench's collect stage makes its offline.jsonl (``dreamgym.pipeline.collect_episodes``: the
same episodes). The stage itself then plays the test tasks; this script leaves that to the bench, so that a setting
is chosen on val only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dreamgym.agent.policy import PolicyConfig
from dreamgym.baselines.sft import train_bc
from dreamgym.cli.train import parse_overrides
from dreamgym.pipeline import collect_episodes, demo_config, extra_files
from dreamgym.sft import SFTConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--offline", type=Path, required=True, help="the seed's offline.jsonl (the bench's collect stage)")
    ap.add_argument("--collect", action="store_true", help="make a missing --offline file as the bench's collect "
                    "stage would (the config's env, offline episodes and noise, the seed)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="DemoConfig field=value")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    try:
        cfg = demo_config("default", {**parse_overrides(args.overrides), "seed": args.seed}, args.config)
    except ValueError as e:
        print(f"sft_val.py: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    if not args.offline.is_file():
        if not args.collect:
            print(f"sft_val.py: {args.offline}: no such file (run the bench's collect stage, or pass --collect)",
                  file=sys.stderr)
            sys.exit(2)
        args.offline.parent.mkdir(parents=True, exist_ok=True)
        collect_episodes(cfg, args.offline, cfg.offline_episodes, "train", cfg.seed)
    # with bc_extra, the extra behaviours' episodes where the bench's collect_extra stage writes them
    extra = extra_files(cfg, args.offline.parent) if cfg.bc_extra else []
    if missing := [str(p) for p in extra if not p.is_file()]:
        print(f"sft_val.py: bc_extra: {missing[0]}: no such file (run the bench's collect_extra stage)", file=sys.stderr)
        sys.exit(2)
    summary = train_bc([args.offline, *extra], cfg.policy_model, args.out, SFTConfig(**cfg.sft), PolicyConfig(**cfg.policy),
                       decision_repeat=cfg.bc_decision_repeat, on_path_only=cfg.bc_on_path,
                       final_repeat=cfg.bc_final_repeat)
    fields = ("policy_model", "policy", "sft", "bc_decision_repeat", "bc_on_path", "bc_final_repeat", "bc_extra", "seed")
    record = {"command": "python benchmarks/sft_val.py " + " ".join(sys.argv[1:]),
              "config": {k: getattr(cfg, k) for k in fields},
              "summary": {k: summary.get(k) for k in ("examples", "steps", "epochs", "train_loss", "seconds")}}
    (args.out / "sft_val.json").write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    print(json.dumps(record["summary"]))


if __name__ == "__main__":
    main()
