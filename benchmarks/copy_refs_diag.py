"""Copy references, looked at closely: how much shorter the targets get, and why a trained M_exp's outputs fail.

    .venv/bin/python benchmarks/copy_refs_diag.py --data data/base/train_ann.jsonl --trajectories 300
    .venv/bin/python benchmarks/copy_refs_diag.py --data data/base/val_ann.jsonl --trajectories 25 \
        --model runs/refs2/exp/pretrained-s0 --out benchmarks/results/copy_refs_diag.json

``--data`` without ``--model``: the mean target tokens (the shipped base's tokenizer) of the first
``--trajectories`` trajectories' M_exp examples, plain and with copy references (configs/exp-shop-tiny.yaml's
prompt settings, k=0). With ``--model`` (a ``train-exp`` run dir, e.g. one of benchmarks/pretrained_base.py's): one
greedy generation per step (no resampling, unlike the fidelity evaluation) and the parse outcome by reason and by
the page type of the real next state, so a failure can be traced to the steps it comes from. Val data for choosing settings:
``dreamgym collect --policy noisy --noise 0.5 --episodes 40 --split val --seed 100000 --env-arg val_fraction=0.1``,
then ``dreamgym annotate --annotator rule``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def target_tokens(trajs: list[Any]) -> dict[str, float]:
    from transformers import AutoTokenizer

    from dreamgym.experience.protocol import ProtocolConfig
    from dreamgym.experience.train import exp_examples
    from dreamgym.llm.pretrained import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("pretrained"))
    out = {}
    for name, refs in (("plain", False), ("copy_refs", True)):
        cfg = ProtocolConfig(history_window=2, k=0, neighbour_states=False, system_prompt="", ground_action=True,
                             copy_refs=refs)
        out[name] = round(statistics.fmean(len(tok(e.target).input_ids) for e in exp_examples(trajs, cfg)), 1)
    return out


def failures(trajs: list[Any], run: Path, show: int = 0) -> dict[str, Any]:
    from dreamgym.experience.model import ExperienceModel
    from dreamgym.experience.protocol import ExperienceQuery, parse_output
    from dreamgym.experience.train import step_kinds
    from dreamgym.llm.base import SamplingParams
    from dreamgym.replay import ReplayBuffer

    summary = json.loads((run / "summary.json").read_text())
    buffer = ReplayBuffer.open(run / "buffer", create=False, read_only=True) if (run / "buffer").is_dir() else None
    model = ExperienceModel.load(summary["snapshots"][-1]["dir"], buffer=buffer)
    queries = model.with_neighbours([ExperienceQuery.at_step(tr, t) for tr in trajs for t in range(len(tr.transitions))],
                                    None)
    fitted = model.served(queries)
    prompts = [f[1] if f is not None else "" for f in fitted]
    layouts = [f[0] if f is not None else model.protocol for f in fitted]
    params = SamplingParams(max_new_tokens=model.cfg.max_new_tokens, temperature=0.0, top_p=1.0, seed=0)
    by_reason: Counter[str] = Counter()
    by_page: dict[str, Counter[str]] = {}  # by the page type of the real next state
    outputs = model.llm.generate(prompts, params)
    shown = 0
    for q, layout, c, kind in zip(queries, layouts, outputs, step_kinds(trajs), strict=True):
        reason = parse_output(c.text, layout, c.finish_reason == "length", query=q).reason or "ok"
        by_reason[reason] += 1
        by_page.setdefault(kind, Counter())[reason] += 1
        if reason != "ok" and shown < show:  # the failing output itself, to stderr
            shown += 1
            print(f"--- {reason} (next page: {kind}; action {q.action})\n{c.text}", file=sys.stderr)
    return {"steps": len(queries), "by_reason": dict(by_reason.most_common()),
            "by_next_page": {k: dict(c.most_common()) for k, c in sorted(by_page.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--trajectories", type=int, default=25)
    parser.add_argument("--model", type=Path, default=None, help="a train-exp run dir: greedy parse failures")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--show", type=int, default=0, help="print this many failing outputs (stderr)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    from dreamgym.types import read_trajectories

    torch.set_num_threads(args.threads)
    trajs = list(itertools.islice(read_trajectories(args.data), args.trajectories))
    result: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "data": str(args.data),
                              "trajectories": len(trajs), "target_tokens": target_tokens(trajs)}
    if args.model is not None:
        result["model"] = str(args.model)
        result["greedy_parse"] = failures(trajs, args.model, args.show)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
