"""The fidelity report of a trained experience model on held-out real transitions (``dreamgym eval-exp``).

Teacher-forced: every held-out step is asked with its real task, history, state and action (and neighbours
from the model's buffer, never from the step's own trajectory), in batches through
:meth:`ExperienceModel.predict`; the answers are scored against the real next state, reward and done by
:func:`~dreamgym.experience.metrics.fidelity_report` (reward/done accuracy, next-state F1 by page type, ε_R,
ε_P, the Lemma 1 bound). Environments with code-judged consistency checks add them (the shop: click, option
and reward consistency, :mod:`dreamgym.envs.shop.fidelity`). :func:`side_by_side` shows real vs dreamt next
states; :func:`judge_transitions` scores dreamt transitions with an LLM judge on the paper's four rubrics.
A policy's dreamt *episodes*, replayed in the real env (wm2real), are scored in :mod:`dreamgym.rl.wm2real`.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from dreamgym.envs.base import find_spec, page_type_of
from dreamgym.experience.annotate import REASONING_KEY, env_of
from dreamgym.experience.metrics import FidelityRecord, fidelity_report
from dreamgym.experience.model import ExperienceModel
from dreamgym.experience.protocol import ExperiencePrediction, ExperienceQuery, repeats_element
from dreamgym.llm.base import LLM, LLMError, SamplingParams
from dreamgym.types import Trajectory

log = logging.getLogger(__name__)

Step = tuple[Trajectory, int]
ConsistencyChecks = Callable[[Sequence[tuple[Trajectory, int, ExperiencePrediction]]], dict[str, Any]]


def heldout_steps(heldout: Sequence[Trajectory], max_transitions: int | None = None, seed: int = 0) -> list[Step]:
    """Steps to evaluate: whole trajectories in a seeded order until ``max_transitions`` (None: all).

    Whole trajectories keep the mix of steps (and the share of terminal steps) of the held-out data.
    """
    order = list(heldout)
    random.Random(seed).shuffle(order)
    steps: list[Step] = []
    for traj in order:
        if max_transitions is not None and len(steps) >= max_transitions:
            break
        steps += [(traj, t) for t in range(len(traj.transitions))]
    return steps[:max_transitions] if max_transitions is not None else steps


def predict_steps(
    model: ExperienceModel, steps: Sequence[Step], batch_size: int = 64, seed: int = 0
) -> list[tuple[ExperienceQuery, ExperiencePrediction]]:
    """The model's answer to each step, asked with the real context, ``batch_size`` steps per model call."""
    out: list[tuple[ExperienceQuery, ExperiencePrediction]] = []
    for start in range(0, len(steps), batch_size):
        chunk = steps[start : start + batch_size]
        exclude = [traj.traj_id for traj, _ in chunk]
        queries = model.with_neighbours([ExperienceQuery.at_step(traj, t) for traj, t in chunk], exclude)
        out += zip(queries, model.predict(queries, exclude_traj=exclude, seed=seed + start), strict=True)
        log.info("eval-exp: %d/%d steps", len(out), len(steps))
    return out


def consistency_checks(env: str) -> ConsistencyChecks | None:
    """``env``'s :attr:`EnvSpec.consistency_checks`, or None when it has none or is not registered."""
    env_spec = find_spec(env)
    checks: ConsistencyChecks | None = env_spec.load("consistency_checks") if env_spec is not None else None
    return checks


def side_by_side(records: Sequence[FidelityRecord], steps: Sequence[Step], n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` sampled steps: action, real vs dreamt next state, reward and done (and the dreamt reasoning)."""
    picked = sorted(random.Random(seed).sample(range(len(records)), min(n, len(records))))
    rows = []
    for i in picked:
        r, (traj, t) = records[i], steps[i]
        rows.append({
            "traj_id": traj.traj_id,
            "step": t,
            "action": r.gold.action,
            "page": page_type_of(env_of(traj))(r.gold.next_state),
            "real_next_state": r.gold.next_state,
            "dreamt_next_state": r.prediction.next_state,
            "real_reward": r.gold.reward,
            "dreamt_reward": r.prediction.reward,
            "real_done": r.gold.done,
            "dreamt_done": r.prediction.done,
            "dreamt_reasoning": r.prediction.reasoning,
            "failure": r.prediction.failure,
        })
    return rows


def format_side_by_side(rows: Sequence[dict[str, Any]]) -> str:
    """The rows of :func:`side_by_side` as text: the two states line by line, differing lines marked ``*``."""
    blocks = []
    for row in rows:
        real, dreamt = row["real_next_state"].splitlines(), row["dreamt_next_state"].splitlines()
        width = max((len(line) for line in real), default=0)
        lines = [f"== {row['traj_id']} step {row['step']}: {row['action']}  ({row['page']} page)"]
        if row["dreamt_reasoning"]:
            lines.append(f"   think: {row['dreamt_reasoning']}")
        for j in range(max(len(real), len(dreamt))):
            a = real[j] if j < len(real) else ""
            b = dreamt[j] if j < len(dreamt) else ""
            lines.append(f"{'*' if a != b else ' '}  {a:<{width}}  |  {b}")
        lines.append(f"   reward {row['real_reward']:.2f} | {row['dreamt_reward']:.2f}    done {int(row['real_done'])} | "
                     f"{int(row['dreamt_done'])}" + (f"    (invalid output: {row['failure']})" if row["failure"] else ""))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def evaluate_experience_model(
    model: ExperienceModel,
    heldout: Sequence[Trajectory],
    max_transitions: int | None = None,
    seed: int = 0,
    batch_size: int = 64,
    show: int = 0,
    gamma: float = 0.99,
    horizon: int = 15,
    judge: LLM | None = None,
    judge_n: int = 100,
) -> dict[str, Any]:
    """Predict every selected held-out step (teacher-forced) and report the fidelity (see the module docstring).

    Returns :meth:`FidelityReport.as_dict` plus the env's consistency checks (``click_consistency``,
    ``reward_consistency``, ... for the shop), ``reasoning_exact`` (the dreamt trace equals the annotated one,
    where the data has traces), ``seconds``, ``steps_per_s``, the model's parse counts, and with ``show`` the
    ``side_by_side`` rows and with a ``judge`` LLM the rubric scores of :func:`judge_transitions`. Invalid
    outputs count as wrong in all of them.
    """
    steps = heldout_steps(heldout, max_transitions, seed)
    if not steps:
        raise ValueError("eval-exp: the held-out data has no transitions")
    t0 = time.monotonic()
    answers = predict_steps(model, steps, batch_size, seed)
    seconds = time.monotonic() - t0
    records = [FidelityRecord(traj.transitions[t], p, q) for (traj, t), (q, p) in zip(steps, answers, strict=True)]
    envs = {env_of(traj) for traj, _ in steps}
    page_type = page_type_of(envs.pop()) if len(envs) == 1 else page_type_of("")
    report = fidelity_report(records, gamma=gamma, horizon=horizon, page_type=page_type).as_dict()

    by_env: dict[str, list[tuple[Trajectory, int, ExperiencePrediction]]] = {}
    for (traj, t), (_, p) in zip(steps, answers, strict=True):
        by_env.setdefault(env_of(traj), []).append((traj, t, p))
    for env, items in sorted(by_env.items()):
        checks = consistency_checks(env)
        if checks is not None:
            report.update(checks(items))  # one env per held-out file in practice; the last one wins otherwise

    traced = [(traj.transitions[t].info[REASONING_KEY], p) for (traj, t), (_, p) in zip(steps, answers, strict=True)
              if isinstance(traj.transitions[t].info.get(REASONING_KEY), str)]
    report["reasoning_exact"] = (sum(p.failure is None and a.strip() == (p.reasoning or "").strip() for a, p in traced)
                                 / len(traced) if traced else None)  # an invalid output is wrong here too
    # A page listing one element twice is no page the env writes, and token F1 barely sees it (a TextWorld M_exp
    # that repeated the new item's commands in place of the carried one's scored F1 0.75 on val with 62% of its pages so).
    valid = [r for r in records if r.prediction.failure is None]
    report["repeated_element_rate"] = (sum(repeats_element(r.prediction.next_state) for r in valid) / len(valid)
                                       if valid else None)
    report["repeated_element_real_rate"] = (sum(repeats_element(r.gold.next_state) for r in valid) / len(valid)
                                            if valid else None)
    report["seconds"] = round(seconds, 1)
    report["steps_per_s"] = round(len(steps) / seconds, 2) if seconds > 0 else None
    report["model_stats"] = model.stats_dict()
    if show:
        report["side_by_side"] = side_by_side(records, steps, show, seed)
    if judge is not None:
        report["judge"] = judge_transitions(judge, records, judge_n, seed)
    return report


def format_report(report: dict[str, Any]) -> str:
    """The headline figures of a fidelity report as text: each accuracy beside its trivial baseline, with the
    reward tolerance stated, ε_R over all and over terminal steps, and wm2real when the report has it."""
    tol = report.get("settings", {}).get("reward_tol", 0.1)

    def num(x: Any) -> str:
        return "n/a" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)

    def row(name: str, value: Any, baseline: Any = None, what: str = "") -> str:
        line = f"{name:46s} {num(value):>7s}"
        return line + (f"   baseline {num(baseline):>7s} ({what})" if what else "")

    copy = report.get("next_state_copy_baseline") or {}
    eps = report.get("epsilon_r") or {}
    lines = [
        row("transitions (terminal)", f"{report['transitions']} ({report['terminal_transitions']})"),
        row(f"reward_accuracy (|Δr| <= {tol:g})", report["reward_accuracy"], report["reward_majority_baseline"],
            f"always {num(report['reward_majority'])}"),
        row(f"terminal_reward_accuracy (|Δr| <= {tol:g})", report["terminal_reward_accuracy"],
            report["terminal_reward_majority_baseline"], f"always {num(report['terminal_reward_majority'])}"),
        row("terminal_reward_exact_accuracy (2 dec.)", report["terminal_reward_exact_accuracy"],
            report["terminal_reward_exact_majority_baseline"], f"always {num(report['terminal_reward_majority'])}"),
        row("done_accuracy", report["done_accuracy"], report["done_majority_baseline"],
            f"always {report['done_majority']}"),
        row("next_state_exact", report["next_state_exact"], copy.get("exact"), "copy the state"),
        row("next_state_f1", report["next_state_f1"], copy.get("f1"), "copy the state"),
        row("invalid_output_rate (wrong in all scores)", report["invalid_output_rate"]),
    ]
    if report.get("repeated_element_rate") is not None:
        lines.append(row("repeated_element_rate (valid pages)", report["repeated_element_rate"],
                         report.get("repeated_element_real_rate"), "the real pages"))
    lines += [row(key, report[key]) for key in report if key.endswith("_consistency")]
    lines += [
        row("epsilon_r max / q / terminal max / terminal q",
            " / ".join(num(eps.get(k)) for k in ("max", "quantile", "terminal_max", "terminal_quantile"))),
        row("epsilon_r (bounds) / epsilon_p", f"{num(eps.get('bound'))} / {num(report['epsilon_p'])}"),
        row(f"lemma1_bound (gamma {report['gamma']:g})", report["lemma1_bound"]),
    ]
    w = report.get("wm2real")
    if w:
        lines += [
            row("wm2real episodes (replayed / unreplayable)", f"{w['episodes']} / {w['unreplayable']}"),
            row(f"wm2real_reward_agreement (|Δr| <= {w['reward_tol']:g})", w["reward_agreement"]),
            row("wm2real_success_agreement", w["success_agreement"]),
            row("wm2real success dreamt / real", f"{num(w['dreamt_success_rate'])} / {num(w['real_success_rate'])}"),
            row("wm2real diverged (ended early / invalid)",
                f"{w['diverged']} ({w['real_ended_early']} / {w['invalid_in_real'] + w['rejected_in_dream']})"),
        ]
    return "\n".join(lines)


def real_env_of(trajs: Sequence[Trajectory]) -> tuple[str, dict[str, Any]]:
    """``(env name, constructor kwargs)`` the trajectories were recorded with (``meta["env_kwargs"]``); they
    must share one env."""
    envs = sorted({env_of(t) for t in trajs})
    if len(envs) != 1:
        raise ValueError(f"the trajectories must come from one env, got {', '.join(envs) or 'none'}")
    kwargs: Any = next((t.meta["env_kwargs"] for t in trajs if t.meta.get("env_kwargs")), {})
    if not isinstance(kwargs, dict):
        raise ValueError(f"meta.env_kwargs must be an object, got {kwargs!r}")
    return envs[0], kwargs


# ------------------------------------------------------------------------------------------ LLM judge

RUBRICS = ("causal_consistency", "diversity", "informativeness", "hallucination")
JUDGE_PROMPT = """You judge a simulated environment transition produced by a world model for an agent's environment.
Score each rubric 0 (bad), 1 (partly) or 2 (good):
- causal_consistency: the next state follows logically from the state and the action (what the action names \
changes as it should, everything else stays; an ending action ends the episode).
- diversity: the next state is specific to this step, not a generic or repeated template.
- informativeness: the next state gives the agent the information it needs to decide its next action.
- hallucination: 2 = no invented content; failure or empty results are signalled rather than invented success.

TASK: {task}
STATE:
{state}
ACTION: {action}
PREDICTED NEXT STATE:
{next_state}
PREDICTED REWARD: {reward:.2f}  DONE: {done}

Answer with JSON only: {{"causal_consistency": s, "diversity": s, "informativeness": s, "hallucination": s}}"""
_JSON_OBJECT = re.compile(r"\{[^{}]*\}", re.DOTALL)


def parse_judgement(text: str) -> dict[str, int] | None:
    """The four 0/1/2 scores from a judge's answer (the first JSON object holding all four), else None."""
    for match in _JSON_OBJECT.finditer(text):
        try:
            obj = json.loads(match.group(0))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        scores = {k: obj.get(k) for k in RUBRICS}
        if all(isinstance(v, int) and not isinstance(v, bool) and v in (0, 1, 2) for v in scores.values()):
            return {k: int(v) for k, v in scores.items() if v is not None}
    return None


def judge_transitions(
    judge: LLM, records: Sequence[FidelityRecord], n: int = 100, seed: int = 0, retries: int = 1,
    max_new_tokens: int = 128,
) -> dict[str, Any]:
    """Mean 0–2 score per rubric over ``n`` sampled dreamt transitions, judged by ``judge`` (any backend).

    An unparsable answer is asked again with another seed up to ``retries`` times, then counted in
    ``unparsable`` and left out of the means; a backend error is counted in ``backend_errors``.
    """
    picked = random.Random(seed).sample(list(records), min(n, len(records)))
    prompts = [
        [{"role": "user", "content": JUDGE_PROMPT.format(
            task=r.query.instruction if r.query else "?", state=r.gold.state, action=r.gold.action,
            next_state=r.prediction.next_state, reward=r.prediction.reward, done=int(r.prediction.done))}]
        for r in picked
    ]
    scores: list[dict[str, int] | None] = [None] * len(prompts)
    counts: Counter[str] = Counter()
    pending = list(range(len(prompts)))
    for attempt in range(1 + retries):
        if not pending:
            break
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0 if attempt == 0 else 0.7,
                                seed=seed + 1000 * attempt)
        try:
            answers = judge.generate([prompts[i] for i in pending], params)
        except LLMError as e:
            log.warning("judge backend failed: %s", e)
            counts["backend_errors"] += len(pending)
            break
        pending_next = []
        for i, answer in zip(pending, answers, strict=True):
            scores[i] = parse_judgement(answer.text)
            if scores[i] is None:
                pending_next.append(i)
        counts["retried"] += len(pending_next) if attempt < retries else 0
        pending = pending_next
    counts["unparsable"] = sum(s is None for s in scores) - counts["backend_errors"]
    valid = [s for s in scores if s is not None]
    means = {k: (sum(s[k] for s in valid) / len(valid) if valid else None) for k in RUBRICS}
    return {"judged": len(valid), "asked": len(prompts), **means, **dict(counts)}
