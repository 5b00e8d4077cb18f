"""Which real transition M_exp could be shown at a dream's steps: recalled, the same game's, or another game's.

    python benchmarks/dream_neighbours.py RUN/seed0 RUN/seed0/dreamgym [--prefix "open "] [--out FILE.json]

For the dreamt steps whose action starts with ``--prefix`` (default ``open ``: a TextWorld container, whose contents
the game hides until it is opened) in a dream run's ``rollouts/``, against the real data the seed's M_exp was trained
on (its ``summary.json`` ``data``, in a fresh replay buffer as ``train-exp`` builds it):

- ``recorded``: steps whose task, state and action the data recorded (``DreamConfig.recall`` answers them as the real
  env did);
- of the others, ``task_action_in_data``: those whose task took the same action somewhere in the data (another state);
- ``retrieved_task_action``: how many of those the top-1 (and any of the top ``--k``) retrieved neighbour is such a
  transition, by φ alone, with ``same_action_first``, and with the task's rows first (``tasks``,
  ``ProtocolConfig.task_neighbours``).
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
    ap.add_argument("dream_dir", type=Path)
    ap.add_argument("--prefix", default="open ", help="count the dreamt steps whose action starts with this")
    ap.add_argument("--k", type=int, default=4, help="neighbours retrieved for the any-of-k count")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    summary_file = args.seed_dir / "experience_model" / "summary.json"
    rollouts = sorted((args.dream_dir / "rollouts").glob("*.jsonl"))
    if not summary_file.is_file() or not rollouts or args.k < 1:
        print(f"error: {args.seed_dir} holds no trained experience_model/, {args.dream_dir} no rollouts/*.jsonl, "
              "or --k < 1", file=sys.stderr)
        return 2

    from dreamgym.experience.protocol import ExperienceQuery
    from dreamgym.experience.recall import Recall
    from dreamgym.experience.train import read_training_data
    from dreamgym.replay import ReplayBuffer
    from dreamgym.replay.encoder import make_encoder

    summary = json.loads(summary_file.read_text())
    trajs = read_training_data(summary["data"])
    recall = Recall.of(trajs)
    task_actions = {(t.task.instruction, x.action) for t in trajs for x in t.transitions}
    steps: list[tuple[str, str, str]] = []
    for path in rollouts:
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            try:
                traj = json.loads(line)
                steps += [(str(traj["task"]["instruction"]), str(x["state"]), str(x["action"]))
                          for x in traj["transitions"] if str(x["action"]).startswith(args.prefix)]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                print(f"error: {path}:{n}: not a trajectory ({e})", file=sys.stderr)
                return 2
    unrecorded = [s for s in steps if recall(ExperienceQuery(s[0], [], [], s[1], s[2])) is None]
    findable = [s for s in unrecorded if (s[0], s[2]) in task_actions]
    report: dict[str, Any] = {"command": "python benchmarks/dream_neighbours.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "prefix": args.prefix, "steps": len(steps),
        "recorded": len(steps) - len(unrecorded), "unrecorded": len(unrecorded), "task_action_in_data": len(findable),
        "retrieved_task_action": {}}
    with tempfile.TemporaryDirectory() as tmp:
        buffer = ReplayBuffer.open(Path(tmp) / "buffer", make_encoder(summary.get("encoder") or "hashing"))
        buffer.add_trajectories(trajs)
        for name, options in (("phi", {}), ("same_action_first", {"same_action_first": True}),
                              ("task_first", {"same_action_first": True, "tasks": [s[0] for s in findable]})):
            hits = buffer.retrieve_batch([(s, a) for _, s, a in findable], args.k, **options) if findable else []
            same = [[(h.instruction, h.action) == (task, action) for h in hs]
                    for (task, _, action), hs in zip(findable, hits, strict=True)]
            report["retrieved_task_action"][name] = {"top1": sum(bool(x) and x[0] for x in same),
                                                     f"any_of_{args.k}": sum(any(x) for x in same)}
        buffer.close()
    print(json.dumps(report))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
