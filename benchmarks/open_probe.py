"""Does TextWorld's M_exp write what a container holds? Probed on a dream's own opens, beside answers that read nothing.

    python benchmarks/open_probe.py RUN/seed0 [RUN/seed0 ...] --rollouts RL_RUN [RL_RUN ...] [--computed-premises]
        [--max-probes N] [--effect-max-commands N] [--out FILE.json]

A TextWorld container shows what it holds only once opened, and a dream whose M_exp writes an empty fridge hides the
recipe from its policy. The probes: every ``open X`` step of the RL runs' dreamt rollouts (``RL_RUN/rollouts``) that
M_exp generated (not recalled from the offline data) in a game whose real data (``RL_RUN/config.yaml``'s
``dream.offline_data``) also opened X. Each seed dir's M_exp, as trained and served (its protocol, prompt budget
and neighbours from the seed's ``buffer``: the offline data; ``--computed-premises`` as the dream serves it), is asked
every probe with the dream's own context (task, history, state, action). Its page is read by the recipe ingredients it
newly offers to take from X (``explain.revealed_ingredients``) and scored right when a recorded open of X in that game
offered exactly those; beside the same score for two answers that read nothing: no ingredient, and every ingredient of
the recipe (a model that writes the recipe into every container). Seed dirs after the first are paired with it probe
by probe: won / lost and the sign test. ``--effect-max-commands N`` also scores TextWorld's recorded effect
(``TextWorldEnv.recorded_effect``, ``DreamConfig.recall_effects``) on the runs' real opens: each answered from another
episode's open of the same container in the same game, against the page the game showed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from dream_signal import BadInput, _offline_data, _recalled, _recorded_of, offline_trajs, read_rollouts


def probes(runs: list[Path]) -> list[tuple[Any, list[str], set[frozenset[str]]]]:
    """``(query, recipe ingredients, the ingredient sets recorded opens offered)`` for each probe of the runs."""
    from dreamgym.envs.textworld.explain import recipe_ingredients
    from dreamgym.experience.protocol import ExperienceQuery

    out = []
    for run in runs:
        recorded = _recorded_of(tuple(_offline_data(run)))
        trajs = read_rollouts(run / "rollouts")
        if recorded is None or trajs is None:
            raise BadInput(f"{run}: no rollouts/ or no dream.offline_data in its config.yaml (not a dream run)")
        for where, traj in trajs:
            instruction = str((traj.get("task") or {}).get("instruction", ""))
            needed = recipe_ingredients(instruction)
            steps = traj["transitions"]
            for t, x in enumerate(steps):
                if not isinstance(x, dict) or _recalled(x) or not str(x.get("action", "")).startswith("open "):
                    continue
                truth = recorded.get((instruction, str(x["action"])))
                if needed and truth:
                    try:
                        history = [(str(h["state"]), str(h["action"])) for h in steps[:t]]
                        query = ExperienceQuery(instruction, history, [], str(x["state"]), str(x["action"]))
                    except (KeyError, TypeError) as e:
                        raise BadInput(f"{where}: not a trajectory ({e})") from None
                    out.append((query, needed, truth))
    return out


def effect_on_real(runs: list[Path], max_commands: int) -> dict[str, int]:
    """TextWorld's recorded effect (``TextWorldEnv.recorded_effect``) on the runs' real data: each real open, answered
    from another episode's open of the same container in the same game (the first recorded), against the page the
    game showed; beside the page left as it was (what a model that writes nothing new would match)."""
    from dreamgym.envs.textworld.effects import open_effect

    opens: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for path in dict.fromkeys(p for run in runs for p in _offline_data(run)):
        for where, traj in offline_trajs((path,)):
            for x in traj["transitions"]:
                if str(x.get("action", "")).startswith("open ") and not x.get("done"):
                    key = (str((traj.get("task") or {}).get("instruction", "")), str(x["action"]))
                    opens.setdefault(key, []).append((where, str(x["state"]), str(x["next_state"])))
    out = {"real_opens": 0, "with_another_record": 0, "answered": 0, "page_as_real": 0, "unchanged_as_real": 0}
    for (_, action), rows in opens.items():
        for where, state, real in rows:
            out["real_opens"] += 1
            other = next(((s, n) for w, s, n in rows if w != where), None)
            if other is None:
                continue
            out["with_another_record"] += 1
            page = open_effect(state, action, *other, max_commands)
            out["answered"] += page is not None
            out["page_as_real"] += page == real.strip()
            out["unchanged_as_real"] += state.strip() == real.strip()
    return out


def score(seed_dir: Path, found: list[tuple[Any, list[str], set[frozenset[str]]]], premises: bool,
          seed: int) -> tuple[dict[str, Any], list[float]]:
    """The seed dir's M_exp on the probes: the report and its per-probe 1/0 (right or not)."""
    from dreamgym.envs.textworld.explain import revealed_ingredients
    from dreamgym.experience.model import ExperienceModel, read_experience_config
    from dreamgym.replay import ReplayBuffer

    buffer = ReplayBuffer.open(seed_dir / "buffer", create=False, read_only=True)
    exp_cfg = read_experience_config(seed_dir / "experience_model")
    if premises:
        exp_cfg = exp_cfg.with_protocol(computed_premises=True)
    model = ExperienceModel.load(seed_dir / "experience_model", buffer=buffer, cfg=exp_cfg)
    queries = model.with_neighbours([q for q, _, _ in found])  # retrieved once: predict keeps filled neighbours
    served = [model.fit_layout(q, model.prompt(q)) for q in queries]
    kept = sum(f is not None and f[0].k > 0 for f in served)  # prompts served with their (first) neighbour
    predictions = model.predict(queries, seed=seed)
    right, offered = [], 0
    for (query, needed, truth), p in zip(found, predictions, strict=True):
        revealed = revealed_ingredients(query.state, query.action, p.next_state, needed) or []
        offered += bool(revealed)
        right.append(float(frozenset(revealed) in truth))
    buffer.close()
    n = len(found)
    return {"seed_dir": str(seed_dir), "protocol": exp_cfg.protocol, "probes": n, "as_recorded": int(sum(right)),
            "as_recorded_share": round(sum(right) / n, 4), "offered_an_ingredient": offered,
            "served_with_neighbour": kept,
            "if_none": sum(frozenset() in truth for _, _, truth in found),
            "if_all": sum(frozenset(needed) in truth for _, needed, truth in found),
            "model_stats": model.stats_dict()}, right


def main(argv: list[str] | None = None) -> int:
    import torch

    from dreamgym.stats import sign_test

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed_dirs", nargs="+", type=Path)
    ap.add_argument("--rollouts", nargs="+", type=Path, required=True, help="dream RL run dirs whose opens to probe")
    ap.add_argument("--computed-premises", action="store_true",
                    help="serve each M_exp with the env's computed trace premises, as the dream does")
    ap.add_argument("--max-probes", type=int, help="the first N probes only (default: all)")
    ap.add_argument("--effect-max-commands", type=int, default=None,
                    help="also score TextWorld's recorded effect on the runs' real opens, at this max_commands")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, help="the JSON report (default: print only)")
    args = ap.parse_args(argv)
    for d in args.seed_dirs:
        if not (d / "experience_model" / "experience.json").is_file() or not (d / "buffer").is_dir():
            print(f"error: {d} holds no trained experience_model/ (experience.json) and buffer/", file=sys.stderr)
            return 2
    try:
        found = probes(args.rollouts)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    found = found[: args.max_probes] if args.max_probes is not None and args.max_probes > 0 else found
    if not found:
        print("error: the runs' dreams generated no open that their real data also made", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    effect = None if args.effect_max_commands is None else effect_on_real(args.rollouts, args.effect_max_commands)
    if effect is not None:
        print(f"recorded effect on the real opens: {effect['page_as_real']} of {effect['with_another_record']} with "
              f"another record give the game's page ({effect['answered']} answered; the page left unchanged: "
              f"{effect['unchanged_as_real']})", flush=True)
    rows, first = [], None
    for d in args.seed_dirs:
        row, right = score(d, found, args.computed_premises, args.seed)
        if first is None:
            first = right
        else:
            test = sign_test(right, first)
            row["vs_first"] = {"won": test["a_better"], "lost": test["b_better"], "sign_test_p": test["p"]}
        rows.append(row)
        print(f"{d}: {row['as_recorded']} of {row['probes']} dreamt opens offered the ingredients a recorded open did "
              f"(no ingredient would match {row['if_none']}, every one {row['if_all']}); "
              f"{row['offered_an_ingredient']} offered one; {row['served_with_neighbour']} prompts kept a neighbour"
              + (f"; against {args.seed_dirs[0]}: {row['vs_first']['won']} won, {row['vs_first']['lost']} lost, "
                 f"p = {row['vs_first']['sign_test_p']}" if "vs_first" in row else ""), flush=True)
    if args.out is not None:
        cmd = "python benchmarks/open_probe.py " + " ".join(sys.argv[1:] if argv is None else argv)
        args.out.write_text(json.dumps({"command": cmd, "probes": len(found), "seeds": rows,
                                        "effect_on_real": effect}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
