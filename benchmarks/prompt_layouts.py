"""Which parts of M_exp's training prompts a token budget keeps: the whole prompt, its neighbours, its history, its state.

    python benchmarks/prompt_layouts.py RUN/seed0 --budget 512 [--every 8] [--cut-history-first]
        [--protocol '{"task_neighbours": true, "neighbour_changes": true}'] [--out FILE.json]

For every ``--every``-th training example of a bench seed's M_exp (its offline data, protocol and neighbours from a
fresh buffer of that data, as ``train-exp`` builds them), the layout :func:`~dreamgym.experience.protocol.fit_prompt`
serves within ``--budget`` tokens (``shorter_layouts``: neighbours first, then history, then state lines), and the
same under the rule before ``ExperienceConfig.prompt_budget``, where each example had ``max_length`` minus its own
target. Counts: prompts kept whole, with a neighbour, with their whole history, with their whole state, and targets
with copy references (``copy_refs``) to text the fitted prompt lacks (``refs_to_dropped_text``; of these, to the
dropped neighbour: ``refs_to_dropped_neighbour``), which SFT taught before ``ProtocolConfig.layout_refs``.
``--cut-history-first`` fits the prompts as ``ProtocolConfig.cut_history_first`` would (the history before the
neighbours), whatever the model was trained with; ``--protocol`` (a JSON object of ``ProtocolConfig`` fields) likewise
fits them under other protocol settings, e.g. neighbours of the same task and action shown as their new lines
(``task_neighbours``, ``neighbour_changes``). ``with_task_neighbour`` counts the fitted prompts that keep a neighbour
recorded in the step's task that took its action (its header says so); ``by_verb`` gives, per first word of the
step's action, [prompts, prompts with such a neighbour] (TextWorld's ``open``: what a container holds).
``cut_neighbour_page`` (in ``--protocol``) cuts the last neighbour's page to its first lines before dropping it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed_dir", type=Path)
    ap.add_argument("--budget", type=int, required=True, help="prompt tokens")
    ap.add_argument("--every", type=int, default=8, help="every n-th training example")
    ap.add_argument("--cut-history-first", action="store_true",
                    help="fit as ProtocolConfig.cut_history_first would: the history before the neighbours")
    ap.add_argument("--protocol", default="{}", help="a JSON object of ProtocolConfig fields to fit the prompts under")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    summary_file = args.seed_dir / "experience_model" / "summary.json"
    if not summary_file.is_file() or args.budget < 1 or args.every < 1:
        print(f"error: {args.seed_dir} holds no trained experience_model/, or --budget/--every < 1", file=sys.stderr)
        return 2

    from dreamgym.experience.protocol import (
        SAME_STEP,
        SAME_TASK_ACTION,
        ProtocolConfig,
        fit_layout,
        retarget,
        truncate_lines,
    )
    from dreamgym.experience.train import encode_prompt, exp_pairs, load_pretrained, read_training_data
    from dreamgym.replay import ReplayBuffer
    from dreamgym.replay.encoder import make_encoder
    from dreamgym.sft import encode_target

    summary = json.loads(summary_file.read_text())
    try:
        fields = json.loads(args.protocol)
        protocol = ProtocolConfig(**{**summary["protocol"], **fields, **({"cut_history_first": True}
                                                                        if args.cut_history_first else {})})
    except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
        print(f"error: --protocol is not a JSON object of ProtocolConfig fields ({str(e).splitlines()[0]})",
              file=sys.stderr)
        return 2
    refs = protocol.model_copy(update={"layout_refs": True})  # exp_pairs' targets point into the whole query
    trajs = read_training_data(summary["data"])
    with tempfile.TemporaryDirectory() as tmp:
        buffer = ReplayBuffer.open(Path(tmp) / "buffer", make_encoder(summary.get("encoder") or "hashing"))
        buffer.add_trajectories(trajs)
        pairs = exp_pairs(trajs, protocol, buffer, chat=summary["chat"])[:: args.every]
        buffer.close()
    _, tokenizer = load_pretrained(str(args.seed_dir / "experience_model"))

    def count(p: Any) -> int:
        return len(encode_prompt(tokenizer, p))

    def kept(budget_of: Any) -> dict[str, int]:
        out = {"prompts": 0, "whole": 0, "with_neighbour": 0, "with_task_neighbour": 0, "whole_history": 0,
               "whole_state": 0, "none_fits": 0, "refs_to_dropped_text": 0, "refs_to_dropped_neighbour": 0,
               "by_verb": {}}
        for query, ex in pairs:
            out["prompts"] += 1
            fitted = fit_layout(query, protocol, summary["chat"], count, budget_of(ex))
            if fitted is None:
                out["none_fits"] += 1
                continue
            layout, prompt = fitted
            # copy references of the target as encoded against the whole query, to text this layout lacks
            # (what SFT taught before ProtocolConfig.layout_refs)
            written = retarget(ex.target, query, refs, layout)
            out["refs_to_dropped_text"] += written != ex.target
            out["refs_to_dropped_neighbour"] += "@n1:" in ex.target and "@n1:" not in (written or "")
            text = "\n".join(m["content"] for m in prompt) if isinstance(prompt, list) else prompt
            out["whole"] += prompt == ex.prompt
            out["with_neighbour"] += "SIMILAR" in text
            task_neighbour = f"(1) {SAME_TASK_ACTION}" in text or f"(1) {SAME_STEP}" in text
            out["with_task_neighbour"] += task_neighbour
            verb = query.action.split()[0] if query.action.split() else ""
            out["by_verb"].setdefault(verb, [0, 0])
            out["by_verb"][verb][0] += 1
            out["by_verb"][verb][1] += task_neighbour
            start = max(0, len(query.history) - protocol.history_window) if protocol.history_window else len(query.history)
            out["whole_history"] += all(f"#{i} " in text for i in range(start + 1, len(query.history) + 1))
            out["whole_state"] += truncate_lines(query.state, protocol.max_state_chars) in text
        out["by_verb"] = dict(sorted(out["by_verb"].items(), key=lambda kv: -kv[1][0]))
        return out

    max_length = int(summary["sft"]["max_length"])
    report = {"command": "python benchmarks/prompt_layouts.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "budget": args.budget, "at_budget": kept(lambda ex: args.budget),
              "own_target_budget": kept(lambda ex: max_length - len(encode_target(tokenizer, ex.target)))}
    print(json.dumps(report))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
