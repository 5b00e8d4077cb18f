"""Issue 12's M_exp cells from bench seeds' fidelity stages, each beside its trivial baseline and its target.

    python benchmarks/fidelity_table.py RUN/seed0 RUN/seed1 ... [--out FILE.json]

Reads each seed dir's ``fidelity.json`` (the bench's fidelity stage: M_exp on held-out real test transitions) and
prints, per seed, the figures issue 12 sets targets for with the gap to each target (positive: met by that much;
negative: missed by that much): click consistency >= 0.9; grounded reward consistency (the dreamt purchase reward
equals the shop's for the real page, 2 decimals) >= 0.9; terminal reward accuracy (within 0.1) >= 0.9 and >= its
majority answer + 0.1; done accuracy >= its majority answer + 0.03; invalid outputs <= 2%. The M_exp's own stats
(``head_rewards`` when a reward head decided the endings' rewards) are kept beside them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

KEYS = ("click_consistency", "item_options_consistency", "option_consistency", "reward_consistency", "terminal_reward_accuracy",
        "terminal_reward_majority_baseline", "terminal_reward_exact_accuracy", "terminal_reward_exact_majority_baseline",
        "done_accuracy", "done_majority_baseline", "invalid_output_rate", "next_state_f1", "terminal_transitions",
        "transitions")


def gaps(f: dict[str, Any]) -> dict[str, float]:
    """Each issue-12 target's margin: the figure minus what the target asks (for invalid outputs, the reverse)."""
    return {
        "click_consistency >= 0.9": f["click_consistency"] - 0.9,
        "reward_consistency >= 0.9": f["reward_consistency"] - 0.9,
        "terminal_reward_accuracy >= 0.9": f["terminal_reward_accuracy"] - 0.9,
        "terminal_reward_accuracy >= majority + 0.1": f["terminal_reward_accuracy"] - f["terminal_reward_majority_baseline"] - 0.1,
        "done_accuracy >= majority + 0.03": f["done_accuracy"] - f["done_majority_baseline"] - 0.03,
        "invalid_output_rate <= 0.02": 0.02 - f["invalid_output_rate"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed_dirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    seeds = {}
    for d in args.seed_dirs:
        try:
            f = json.loads((d / "fidelity.json").read_text(encoding="utf-8"))
            cells = {k: f[k] for k in KEYS}
            margins = gaps(f)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: {d / 'fidelity.json'}: no fidelity report ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
        seeds[str(d)] = {**cells, "model_stats": f.get("model_stats"), "target_margins": {k: round(v, 4) for k, v in margins.items()}}
        missed = [f"{k} by {-v:.3f}" for k, v in margins.items() if v < 0]
        print(f"{d}: terminal reward acc {f['terminal_reward_accuracy']:.3f} (majority {f['terminal_reward_majority_baseline']:.3f}), "
              f"grounded reward consistency {f['reward_consistency']:.3f}, click {f['click_consistency']:.3f}, option "
              f"{f['option_consistency']:.3f}, done {f['done_accuracy']:.3f} (majority {f['done_majority_baseline']:.3f}), "
              f"invalid {f['invalid_output_rate']:.3f}; missed: {', '.join(missed) or 'none'}")
    if args.out:
        out = {"what": "issue 12's M_exp cells from bench seeds' fidelity stages (held-out real test transitions), "
                       "beside their majority baselines, with each target's margin (negative: missed by that much)",
               "command": "python benchmarks/fidelity_table.py " + " ".join(sys.argv[1:] if argv is None else argv),
               "seeds": seeds}
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
