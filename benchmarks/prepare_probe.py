"""Does TextWorld's M_exp know when a meal cannot be prepared? Probes on val games, beside the majority answer.

    python benchmarks/prepare_probe.py RUN/seed0 [RUN/seed0 ...] [--games N] [--computed-premises] [--out FILE.json]

A dream pays its policy for `prepare meal` then `eat meal` whatever it carries if M_exp answers every `prepare meal`
with `Adding the meal to your inventory.`; the real game answers `You still miss something.` until every ingredient
of the recipe is carried. The offline data barely shows that answer (the noisy oracle prepares once it has all: 18 of
772 `prepare meal` steps in seed 0's data), so teacher-forced fidelity on real episodes does not test it.

Each val game (the first ``--games`` of the config's val split) is played by TextWorld's oracle. The first time
`prepare meal` is admissible while the oracle's next command is something else, the probe takes `prepare meal`
there (an *early* probe; the real game's answer is recorded, and the game, unchanged by it, goes on); the step where
the oracle itself prepares is a *ready* probe; and the game replayed to the oracle's last `take`, with another item
taken instead, then `prepare meal`, is a *wrong* probe (the dream's case: as many items carried, one not the
recipe's). M_exp (as trained and served: its own prompt budget and neighbours) predicts each probe's next state; its answer is the class of the predicted feedback line (``miss``, ``meal`` or
``other``). Accuracy is printed beside the majority answer's, and per class, so a model that always prepares the
meal scores the ready probes' share, and 0 on the early ones.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

PREPARE = "prepare meal"


def answer(next_state: str) -> str:
    """The class of a next state's feedback: ``miss`` (not all ingredients), ``meal`` (prepared) or ``other``."""
    feedback = next((ln for ln in next_state.splitlines() if "] feedback: " in ln), "").lower()
    return "miss" if "still miss something" in feedback else "meal" if "adding the meal" in feedback else "other"


def probes(cfg: Any, games: int) -> list[tuple[Any, str, str]]:
    """``(query, kind, real answer)`` for the early, ready and wrong probes of the first ``games`` val games."""
    from dreamgym.envs import make
    from dreamgym.envs.textworld.policies import OraclePolicy
    from dreamgym.experience.protocol import ExperienceQuery

    env = make(cfg.env, **cfg.env_kwargs)
    out: list[tuple[Any, str, str]] = []
    try:
        for task in env.tasks("val")[:games]:
            obs, info = env.reset(options={"task": task, "split": "val"})
            oracle = OraclePolicy()
            oracle.reset(env, task)
            history: list[tuple[str, str]] = []
            early_done = False
            for _ in range(cfg.max_steps):
                action = oracle.act(obs, info)
                if action != PREPARE and PREPARE in (info.get("admissible_actions") or []) and not early_done:
                    # the real game's answer to preparing now; it changes nothing but the feedback
                    early_done = True
                    early_obs, _, ended, cut, info = env.step(PREPARE)
                    out.append((ExperienceQuery(task.instruction, list(history), [], obs, PREPARE), "early",
                                answer(early_obs)))
                    if ended or cut:
                        break
                    history.append((obs, PREPARE))
                    obs = early_obs
                    action = oracle.act(obs, info)
                next_obs, _, ended, cut, info = env.step(action)
                if action == PREPARE:
                    out.append((ExperienceQuery(task.instruction, list(history), [], obs, PREPARE), "ready",
                                answer(next_obs)))
                    wrong = _wrong_probe(env, task, history)
                    if wrong is not None:
                        out.append(wrong)
                    break
                history.append((obs, action))
                obs = next_obs
                if ended or cut:
                    break
    finally:
        env.close()
    return out


def _wrong_probe(env: Any, task: Any, history: list[tuple[str, str]]) -> tuple[Any, str, str] | None:
    """The game replayed to the oracle's last ``take``, another admissible ``take`` instead (the first by a
    per-task seeded draw), then ``prepare meal``: a *wrong* probe, as many items carried as when ready (None where
    no other take or no ``prepare meal`` is admissible)."""
    from dreamgym.experience.protocol import ExperienceQuery

    takes = [i for i, (_, a) in enumerate(history) if a.startswith("take ")]
    if not takes:
        return None
    i = takes[-1]
    obs, info = env.reset(options={"task": task, "split": "val"})
    for _, a in history[:i]:
        obs, _, _, _, info = env.step(a)
    others = sorted(c for c in info.get("admissible_actions") or [] if c.startswith("take ") and c != history[i][1])
    if not others:
        return None
    other = random.Random(task.task_id).choice(others)
    took, _, ended, cut, info = env.step(other)
    if ended or cut or PREPARE not in (info.get("admissible_actions") or []):
        return None
    real = env.step(PREPARE)[0]
    return ExperienceQuery(task.instruction, [*history[:i], (obs, other)], [], took, PREPARE), "wrong", answer(real)


def score(seed_dir: Path, cfg: Any, found: list[tuple[Any, str, str]], premises: bool = False) -> dict[str, Any]:
    import torch

    from dreamgym.experience.model import ExperienceModel, read_experience_config
    from dreamgym.replay import ReplayBuffer

    buffer = ReplayBuffer.open(seed_dir / "buffer", create=False, read_only=True) if (seed_dir / "buffer").is_dir() else None
    torch.set_num_threads(int(cfg.exp_sft.get("num_threads") or 1))
    exp_cfg = read_experience_config(seed_dir / "experience_model")
    if premises:  # served with the env's computed premises, whatever the model was saved with
        exp_cfg = exp_cfg.with_protocol(computed_premises=True)
    model = ExperienceModel.load(seed_dir / "experience_model", buffer=buffer, cfg=exp_cfg)
    predictions = model.predict([q for q, _, _ in found], seed=cfg.seed)
    said = [answer(p.next_state) for p in predictions]
    real = [r for _, _, r in found]
    majority, share = Counter(real).most_common(1)[0]
    by_kind = {}
    for kind in ("early", "ready", "wrong"):
        rows = [(s, r) for (_, k, r), s in zip(found, said, strict=True) if k == kind]
        by_kind[kind] = {"probes": len(rows), "real": dict(Counter(r for _, r in rows)),
                         "said": dict(Counter(s for s, _ in rows)),
                         "accuracy": round(sum(s == r for s, r in rows) / len(rows), 4) if rows else None}
    return {"seed_dir": str(seed_dir), "computed_premises": exp_cfg.protocol_config().computed_premises,
            "probes": len(found),
            "accuracy": round(sum(s == r for s, r in zip(said, real, strict=True)) / len(found), 4),
            "majority_answer": majority, "majority_baseline": round(share / len(found), 4), "by_kind": by_kind,
            "model_stats": model.stats_dict()}


def main(argv: list[str] | None = None) -> int:
    from dreamgym.pipeline import DemoConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed_dirs", nargs="+", type=Path)
    ap.add_argument("--games", type=int, default=30, help="val games to probe (default 30)")
    ap.add_argument("--out", type=Path, help="the JSON report (default: print only)")
    ap.add_argument("--computed-premises", action="store_true",
                    help="serve each M_exp with the env's computed trace premises (ProtocolConfig.computed_premises)")
    args = ap.parse_args(argv)
    configs = []
    for d in args.seed_dirs:
        if not (d / "experience_model" / "experience.json").is_file() or not (d / "demo_config.yaml").is_file():
            print(f"error: {d} holds no trained experience_model/ (experience.json) and demo_config.yaml", file=sys.stderr)
            return 2
        cfg = DemoConfig.model_validate(yaml.safe_load((d / "demo_config.yaml").read_text()))
        if cfg.env != "textworld":
            print(f"error: {d} is a {cfg.env} run; the probes are TextWorld's", file=sys.stderr)
            return 2
        configs.append(cfg)
    if args.games < 1:
        print(f"error: --games must be at least 1, got {args.games}", file=sys.stderr)
        return 2
    rows, cache = [], {}
    for d, cfg in zip(args.seed_dirs, configs, strict=True):
        key = json.dumps(cfg.env_kwargs, sort_keys=True)
        if key not in cache:  # the same val games for configs with the same env
            cache[key] = probes(cfg, args.games)
        row = score(d, cfg, cache[key], args.computed_premises)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out is not None:
        cmd = "python benchmarks/prepare_probe.py " + " ".join(sys.argv[1:] if argv is None else argv)
        args.out.write_text(json.dumps({"command": cmd, "split": "val", "seeds": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
