"""How much learning signal RL runs got, iteration by iteration: success, the GRPO groups whose rewards did not vary.

    python benchmarks/dream_signal.py RUN_DIR [RUN_DIR ...] [--out FILE.json]

RUN_DIR is an RL run's dir (``metrics.jsonl``, ``summary.json``), e.g. a bench seed's ``runs/tw0/seed0/dreamgym``.
A group whose episodes all got the same reward has advantages of 0 under GRPO, so it moves nothing: a dream that
pays every episode (or a policy that plays every episode of a group alike) teaches nothing, whatever its fidelity.
Per iteration: the rollouts' success, the share of groups with zero reward variance, the gradient norm and the
policy's per-token entropy; per run, the same over all iterations, the run's wm2real replay (dreamt episodes'
actions replayed in the real env), where it has one, and how many of its rollouts' next states (``rollouts/``) list
one element twice (the same ``type: text`` line under two ids: on TextWorld a dreamt page that offers the item just
taken five times; the real game's pages never do). On TextWorld the rollouts' ``prepare meal`` steps are also
counted by whether every ingredient of the task's recipe was carried and whether the next page made the meal: the
real game makes it exactly when none is missing, so a meal made with one missing is a reward the real game never pays
(``--data`` on real episodes checks the count: 0 such meals there), and the paid episodes by the meals they made:
the real game pays only for eating one made with none missing. And its ``open X`` steps by whether the next page
offers to take a recipe ingredient from X: what a container holds is hidden until opened, so a dream that invents
it can hide the recipe from the policy (the real game's data says how often opening reveals one). Steps the dream
recalled from the offline data (``DreamConfig.recall``: marked ``recalled`` in their info) are counted apart, and the
generated opens (M_exp's own pages) that offered an ingredient; where the run's ``config.yaml`` names its real data
(``dream.offline_data``), the generated opens the data also made in the same game, and how many offered exactly
the recipe ingredients a recorded one did, beside what "no ingredient" and "every ingredient" would match (a dream
that writes the recipe into every container is not reading the game). And the
valid, non-final steps that changed nothing but their feedback by the env's own reading of the two pages
(``TextEnv.had_effect``; what ``RLConfig.no_effect_penalty`` charges), the ``prepare meal`` ones apart. And how the
last iteration's episodes ended (``last_endings``: the last command's first word, won / lost / unfinished).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path
from typing import Any


class BadInput(Exception):
    pass


def _iterations(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise BadInput(f"{path.parent} holds no metrics.jsonl (not an RL run dir)")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadInput(f"{path}:{n}: not JSON ({e.msg})") from None
        if isinstance(row, dict) and "task_variances" in row:  # an RL iteration (eval-only lines have none)
            rows.append(row)
    if not rows:
        raise BadInput(f"{path} holds no RL iteration with task_variances")
    return rows


def read_rollouts(rollouts: Path) -> list[tuple[str, dict[str, Any]]] | None:
    """The trajectories in ``rollouts/*.jsonl`` (or in the one file ``rollouts``), each with its ``file:line``, read
    once for every count below; None where there is no such file."""
    files = [rollouts] if rollouts.is_file() else sorted(rollouts.glob("*.jsonl")) if rollouts.is_dir() else []
    if not files:
        return None
    trajs = []
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                traj = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadInput(f"{path}:{n}: not a trajectory ({e})") from None
            if not isinstance(traj, dict) or not isinstance(traj.get("transitions"), list):
                raise BadInput(f"{path}:{n}: not a trajectory (no transitions list)")
            trajs.append((f"{path}:{n}", traj))
    return trajs


def _recalled(step: Any) -> bool:
    """Whether a dreamt step was recalled from the offline data, not generated (``DreamConfig.recall``)."""
    return isinstance(step, dict) and isinstance(step.get("info"), dict) and bool(step["info"].get("recalled"))


def repeated_pages(trajs: list[tuple[str, dict[str, Any]]]) -> dict[str, int]:
    """How many next states list one ``[id] type: text`` element's text twice, and how many were recalled."""
    from dreamgym.experience.protocol import repeats_element

    steps = [x for _, t in trajs for x in t["transitions"]]
    pages = [str(x.get("next_state", "")) if isinstance(x, dict) else "" for x in steps]
    return {"pages": len(pages), "repeated_element_pages": sum(map(repeats_element, pages)),
            "recalled_pages": sum(map(_recalled, steps))}


def steps_without_effect(trajs: list[tuple[str, dict[str, Any]]]) -> dict[str, int] | None:
    """Valid, non-final steps of the trajectories whose task names a registered env (the first one named), and
    those that env reads as changing nothing but the feedback, with the ``prepare meal`` ones apart; None where no
    trajectory names an env or the env cannot tell."""
    from dreamgym.envs import find_spec, make

    envs = [str(t["task"]["env"]) for _, t in trajs if isinstance(t.get("task"), dict) and t["task"].get("env")]
    if not envs or find_spec(envs[0]) is None:
        return None
    env = make(envs[0])
    counts = {"steps": 0, "no_effect": 0, "prepare_meal": 0, "prepare_meal_no_effect": 0}
    try:
        for where, traj in trajs:
            if not isinstance(traj.get("task"), dict) or traj["task"].get("env") != envs[0]:
                continue
            for x in traj["transitions"]:
                try:
                    if x.get("done") or (x.get("info") or {}).get("invalid_action"):
                        continue
                    effect = env.had_effect(str(x["state"]), str(x["next_state"]))
                except (KeyError, TypeError, AttributeError) as e:
                    raise BadInput(f"{where}: not a trajectory ({e})") from None
                if effect is None:
                    return None
                prepare = x.get("action") == "prepare meal"
                counts["steps"] += 1
                counts["no_effect"] += not effect
                counts["prepare_meal"] += prepare
                counts["prepare_meal_no_effect"] += prepare and not effect
    finally:
        env.close()
    return counts


Reveals = dict[tuple[str, str], set[frozenset[str]]]


def recorded_reveals(trajs: list[tuple[str, dict[str, Any]]]) -> Reveals:
    """What the real game showed: per (task instruction, ``open X``), each set of recipe ingredients that one of the
    data's opens offered to take from X (a container's contents change only when the player moves them)."""
    from dreamgym.envs.textworld.explain import recipe_ingredients, revealed_ingredients

    out: Reveals = {}
    for where, traj in trajs:
        try:
            instruction = str((traj.get("task") or {}).get("instruction", ""))
            needed = recipe_ingredients(instruction)
            for x in traj["transitions"] if needed else []:
                revealed = revealed_ingredients(str(x["state"]), str(x["action"]), str(x["next_state"]), needed)
                if revealed is not None:
                    out.setdefault((instruction, str(x["action"])), set()).add(frozenset(revealed))
        except (KeyError, TypeError, AttributeError) as e:
            raise BadInput(f"{where}: not a trajectory ({e})") from None
    return out


def meal_verdicts(trajs: list[tuple[str, dict[str, Any]]], recorded: Reveals | None = None) -> dict[str, int] | None:
    """TextWorld's ``prepare meal`` steps by (every recipe ingredient carried, meal made), and the paid episodes by
    the meals they made; None where no episode's task names a recipe or no step prepares a meal. With ``recorded``
    (:func:`recorded_reveals` of the real data), the generated opens that the data also made in their game, and of
    those the ones that offered exactly the recipe ingredients a recorded one did, beside what two answers that
    read nothing would match: no ingredient, and every ingredient of the recipe."""
    from dreamgym.envs.textworld.explain import meal_outcome, recipe_ingredients, revealed_ingredients

    counts = {"ready_made": 0, "ready_refused": 0, "missing_made": 0, "missing_refused": 0,
              "paid_episodes": 0, "paid_after_ready_meal": 0, "paid_after_missing_meal_only": 0, "paid_without_meal": 0,
              "opens": 0, "opens_revealing_ingredient": 0, "opens_recalled": 0, "opens_generated_revealing": 0,
              "opens_generated_on_record": 0, "opens_generated_as_recorded": 0, "opens_as_recorded_if_none": 0,
              "opens_as_recorded_if_all": 0}
    for where, traj in trajs:
        try:
            instruction = str((traj.get("task") or {}).get("instruction", ""))
            needed = recipe_ingredients(instruction)
            steps = [(str(x["state"]), str(x["action"]), str(x["next_state"]), _recalled(x))
                     for x in (traj["transitions"] if needed else [])]
        except (KeyError, TypeError, AttributeError) as e:
            raise BadInput(f"{where}: not a trajectory ({e})") from None
        made = set()
        for state, action, next_state, recalled in steps:
            if (outcome := meal_outcome(state, action, next_state, needed)) is not None:
                counts[f"{'ready' if outcome[0] else 'missing'}_{'made' if outcome[1] else 'refused'}"] += 1
                if outcome[1]:
                    made.add("ready" if outcome[0] else "missing")
            if (revealed := revealed_ingredients(state, action, next_state, needed)) is not None:
                counts["opens"] += 1
                counts["opens_revealing_ingredient"] += bool(revealed)
                counts["opens_recalled"] += recalled
                counts["opens_generated_revealing"] += bool(revealed) and not recalled  # M_exp's own pages
                truth = None if recalled or recorded is None else recorded.get((instruction, action))
                if truth:
                    counts["opens_generated_on_record"] += 1
                    counts["opens_generated_as_recorded"] += frozenset(revealed) in truth
                    counts["opens_as_recorded_if_none"] += frozenset() in truth
                    counts["opens_as_recorded_if_all"] += frozenset(needed) in truth
        if needed and traj.get("success"):  # the real game pays only for eating a meal made with none missing
            counts["paid_episodes"] += 1
            counts["paid_after_ready_meal" if "ready" in made else "paid_after_missing_meal_only" if made
                   else "paid_without_meal"] += 1
    return counts if any(counts.values()) else None


def signal(run: Path) -> dict[str, Any]:
    """The run's per-iteration signal and its totals (see the module docstring)."""
    per_iter = []
    groups = flat = 0
    for row in _iterations(run / "metrics.jsonl"):
        variances = [float(v) for v in row["task_variances"]]
        zero = sum(v <= 1e-12 for v in variances)
        groups, flat = groups + len(variances), flat + zero
        per_iter.append({"iteration": row.get("iteration"), "success": row.get("success"),
                         "episode_steps": row.get("episode_steps"), "groups": len(variances),
                         "zero_variance_groups": zero, "grad_norm": row.get("grad_norm"), "entropy": row.get("entropy")})
    successes = [r["success"] for r in per_iter if r["success"] is not None]
    summary_path = run / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    trajs = read_rollouts(run / "rollouts")
    recorded = _recorded_of(tuple(_offline_data(run)))
    return {"run": str(run), "iterations": per_iter,
            "mean_success": round(statistics.fmean(successes), 4) if successes else None,
            "groups": groups, "zero_variance_groups": flat,
            "zero_variance_share": round(flat / groups, 4) if groups else None,
            "wm2real": summary.get("wm2real"), **_page_counts(trajs, "rollout_pages", recorded),
            "last_endings": last_endings(trajs) if trajs else None}


def last_endings(trajs: list[tuple[str, dict[str, Any]]]) -> dict[str, int]:
    """The last rollout file's episodes (the last iteration's) by how they ended: the first word of the last
    command, then ``won``, ``lost`` (done without success) or ``unfinished``. A policy that learns to end its
    episodes early shows here: on TextWorld an ``eat lost`` is an ingredient eaten, which ends the game."""
    last = max(where.rpartition(":")[0] for where, _ in trajs)
    counts: dict[str, int] = {}
    for where, traj in trajs:
        x = traj["transitions"][-1] if traj["transitions"] else {}
        if where.rpartition(":")[0] == last and isinstance(x, dict):
            end = "won" if traj.get("success") else "lost" if x.get("done") else "unfinished"
            key = f"{str(x.get('action', '')).partition(' ')[0]} {end}"
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _offline_data(run: Path) -> list[str]:
    """The real data a dream run was given (its ``config.yaml``'s ``dream.offline_data``); [] for another run."""
    import yaml

    try:
        config = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").is_file() else {}
        paths = ((config or {}).get("dream") or {}).get("offline_data") or []
    except (yaml.YAMLError, AttributeError) as e:
        raise BadInput(f"{run / 'config.yaml'}: not an RL config ({str(e).splitlines()[0]})") from None
    return [str(x) for x in paths] if isinstance(paths, list) else []


@functools.cache
def offline_trajs(paths: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """The trajectories of a run's real data files (read once for every run and count given them)."""
    trajs = []
    for path in paths:
        if (read := read_rollouts(Path(path))) is None:
            raise BadInput(f"{path}: the run's offline data is not there")
        trajs += read
    return trajs


@functools.cache
def _recorded_of(paths: tuple[str, ...]) -> Reveals | None:
    """:func:`recorded_reveals` of the files; None without files."""
    trajs = offline_trajs(paths)
    return recorded_reveals(trajs) if trajs else None


def _page_counts(trajs: list[tuple[str, dict[str, Any]]] | None, key: str,
                 recorded: Reveals | None = None) -> dict[str, Any]:
    return {key: repeated_pages(trajs) if trajs is not None else None,
            "meals": meal_verdicts(trajs, recorded) if trajs is not None else None,
            "no_effect": steps_without_effect(trajs) if trajs is not None else None}


def _meals_text(m: dict[str, int] | None) -> str:
    if not m:
        return ""
    missing = m["missing_made"] + m["missing_refused"]
    return (f"; meals made with an ingredient missing {m['missing_made']} of {missing} such prepares (the real game: 0), "
            f"with none missing {m['ready_made']} of {m['ready_made'] + m['ready_refused']}; of {m['paid_episodes']} paid "
            f"episodes {m['paid_after_ready_meal']} made a meal with none missing, {m['paid_after_missing_meal_only']} "
            f"only with one missing, {m['paid_without_meal']} none; {m['opens_revealing_ingredient']} of {m['opens']} "
            f"opens offered a recipe ingredient ({m['opens_recalled']} opens recalled; "
            f"{m['opens_generated_revealing']} of the {m['opens'] - m['opens_recalled']} generated offered one)"
            + (f"; of {m['opens_generated_on_record']} generated opens the data also made in their game, "
               f"{m['opens_generated_as_recorded']} offered the ingredients a recorded one did (no ingredient would "
               f"match {m['opens_as_recorded_if_none']}, every one {m['opens_as_recorded_if_all']})"
               if m["opens_generated_on_record"] else ""))


def _no_effect_text(c: dict[str, int] | None) -> str:
    if not c:
        return ""
    return (f"; {c['no_effect']} of {c['steps']} valid non-final steps changed nothing but the feedback "
            f"({c['prepare_meal_no_effect']} of {c['prepare_meal']} prepares)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--data", type=Path, action="append", default=[],
                    help="a trajectory JSONL (e.g. the real offline data) whose pages are counted the same way")
    ap.add_argument("--out", type=Path, help="the JSON report (default: print only)")
    args = ap.parse_args(argv)
    try:
        reports = [signal(run) for run in args.runs]
        data = []
        for path in args.data:
            if not path.is_file():
                raise BadInput(f"{path}: no such trajectory file")
            data.append({"data": str(path), **_page_counts(read_rollouts(path), "pages")})
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for r in reports:
        w = r["wm2real"] or {}
        print(f"{r['run']}: success {r['mean_success']}, groups with zero reward variance {r['zero_variance_groups']} "
              f"of {r['groups']}; wm2real: {w.get('invalid_in_real', '-')} of {w.get('episodes', '-')} replayed "
              f"episodes take an action the real env rejects, real success {w.get('real_success_rate', '-')}"
              + (f"; {p['repeated_element_pages']} of {p['pages']} rollout pages list an element twice, "
                 f"{p['recalled_pages']} recalled" if (p := r["rollout_pages"]) else "") + _meals_text(r["meals"])
              + _no_effect_text(r["no_effect"]))
    for d in data:
        print(f"{d['data']}: {d['pages']['repeated_element_pages']} of {d['pages']['pages']} pages list an element twice"
              + _meals_text(d["meals"]) + _no_effect_text(d["no_effect"]))
    if args.out:
        cmd = "python benchmarks/dream_signal.py " + " ".join(sys.argv[1:] if argv is None else argv)
        args.out.write_text(json.dumps({"command": cmd, "runs": reports, "data": data}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
