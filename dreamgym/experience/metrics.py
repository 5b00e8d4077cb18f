"""Fidelity metrics of the experience model: predicted transitions scored against real ones (no model here).

Per transition: reward within a tolerance, done flag, next state exact / element-set / token-F1 match.
Aggregated in :class:`FidelityReport`, which also estimates the model errors of the paper's Lemma 1 (App. B):

    |J_real(π) − J_dream(π)| ≤ ε_R / (1 − γ) + 2 γ R_max ε_P / (1 − γ)²

* ε_R = sup |R − R̂|. A supremum cannot be estimated from samples: the sample max is set by a single outlier
  (one wrong purchase reward makes it 1.0) and the mean understates it. The report gives the mean, the max and
  a high quantile (default 0.95), over all steps and over terminal steps only. Rewards are decided on terminal
  steps (the shop rewards purchases only): when they are a few percent of the steps, the all-steps quantile is
  0 however many purchase rewards are wrong. The bounds therefore plug in ``epsilon_r["bound"]``, the larger of
  the terminal-only and the all-steps quantile (the all-steps one alone without terminal steps): an estimate
  that ignores the worst 5% of the steps of each kind, not a guarantee.
* ε_P = sup TV(P(·|s,a), P̂(·|s,a)). The real envs are deterministic and greedy decoding is too, so for one
  (s, a) both distributions are point masses and their TV distance is exactly 1[ŝ' ≠ s'] (0 when equal).
  We compare next states as element sets (order-insensitive), so ε_P = 1 − element-set match rate: the
  average-case TV, a proxy for the sup.

The real done flag is :func:`~dreamgym.experience.protocol.terminated` (a ``max_steps`` cut is not an ending).
An invalid (unparsable) model output is wrong in every score: its reward, done flag and next state count as
wrong in every accuracy, match rate and F1, and its reward error is R_max. The fallback the dream env serves
instead (``failure_prediction``: state unchanged, reward 0, not done) is not scored as a prediction: it often
equals the real outcome (most steps earn 0 and do not end, an invalid action leaves the state as it was), so
a model that never answers would otherwise score well.

Each accuracy comes with its trivial baseline: always predicting the most common real value
(``done_majority_baseline``, ``reward_majority_baseline``, ``terminal_reward_majority_baseline``, and the
exact one for ``terminal_reward_exact_accuracy``), and for the next state, copying the current state
(``next_state_copy_baseline``).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dreamgym.envs.base import one_page_type
from dreamgym.experience.protocol import ExperiencePrediction, ExperienceQuery, terminated
from dreamgym.types import Transition

# ---------------------------------------------------------------------------------------- per state


def _lines(state: str) -> list[str]:
    return [line.strip() for line in state.splitlines() if line.strip()]


def state_token_f1(pred: str, gold: str) -> float:
    """F1 of the bags (multisets) of whitespace tokens, case-sensitive (SQuAD-style).

    precision = |pred ∩ gold| / |pred|, recall = |pred ∩ gold| / |gold|, with multiset intersection.
    Two empty states score 1.0; one empty state scores 0.0.
    """
    p, g = Counter(pred.split()), Counter(gold.split())
    if not p or not g:
        return float(not p and not g)
    common = sum((p & g).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(p.values()), common / sum(g.values())
    return 2 * precision * recall / (precision + recall)


def element_set_match(pred: str, gold: str) -> bool:
    """Whether both states hold the same set of lines (``[id] type: text``), ignoring order, blank lines and
    surrounding spaces."""
    return set(_lines(pred)) == set(_lines(gold))


def next_state_exact(pred: str, gold: str) -> bool:
    """Whether both states hold the same lines in the same order (blank lines and surrounding spaces ignored)."""
    return _lines(pred) == _lines(gold)


# ---------------------------------------------------------------------------------------- bounds


def lemma1_bound(eps_r: float, eps_p: float, gamma: float, r_max: float = 1.0) -> float:
    """Lemma 1 (discounted): ε_R / (1 − γ) + 2 γ R_max ε_P / (1 − γ)². Infinite for γ = 1."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if gamma == 1.0:
        return math.inf
    return eps_r / (1 - gamma) + 2 * gamma * r_max * eps_p / (1 - gamma) ** 2


def finite_horizon_bound(
    eps_r: float, eps_p: float, horizon: int, r_max: float = 1.0, v_max: float | None = None
) -> float:
    """Lemma 1 for an undiscounted episode of at most ``horizon`` steps.

    The simulation lemma telescopes J − Ĵ = Σ_t E[(R − R̂)(s_t, a_t) + ((P − P̂) V_{t+1})(s_t, a_t)] along
    the dream's trajectory, and |(P − P̂) V| ≤ 2 TV · max|V|, so

        |J − Ĵ| ≤ Σ_{t=0}^{H−1} [ε_R + 2 ε_P · min(v_max, (H − 1 − t) R_max)]
               = H ε_R + R_max ε_P H (H − 1)                 (v_max = None: no bound on the return)

    With outcome rewards (one reward per episode) the return-to-go is at most R_max: pass ``v_max=r_max``
    for H ε_R + 2 (H − 1) R_max ε_P. The discounted Lemma 1 is the same sum with γ^t weights and V ≤ R_max/(1 − γ).
    """
    if horizon < 0:
        raise ValueError(f"horizon must be >= 0, got {horizon}")
    cap = math.inf if v_max is None else v_max
    return sum(eps_r + 2 * eps_p * min(cap, (horizon - 1 - t) * r_max) for t in range(horizon))


# ---------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class FidelityRecord:
    """One held-out real transition (``gold``) and the experience model's answer for it."""

    gold: Transition
    prediction: ExperiencePrediction
    query: ExperienceQuery | None = None  # the context it was asked in, for reports that slice by it


@dataclass
class FidelityReport:
    """Aggregated fidelity of predicted transitions (see the module docstring for ε_R, ε_P and the bounds).

    Accuracies count an invalid output as wrong; ``*_baseline`` is the accuracy of a trivial predictor.
    """

    transitions: int
    reward_accuracy: float  # |r̂ − r| <= reward_tol
    reward_majority: float  # the most common real reward (2 decimals)
    reward_majority_baseline: float  # accuracy (within reward_tol) of always predicting it
    terminal_transitions: int
    terminal_reward_accuracy: float | None  # |r̂ − r| <= reward_tol on steps where the real env ended the episode
    terminal_reward_exact_accuracy: float | None  # r̂ = r to 2 decimals, on the same steps
    terminal_reward_majority: float | None  # the most common terminal reward (2 decimals)
    terminal_reward_majority_baseline: float | None  # accuracy (within reward_tol) of always predicting it
    terminal_reward_exact_majority_baseline: float | None  # its exact (2 decimals) accuracy
    reward_mae: float
    done_accuracy: float
    done_majority: bool  # the most common real done flag
    done_majority_baseline: float  # accuracy of always predicting it
    invalid_output_rate: float
    invalid_output_reasons: dict[str, int]
    next_state_exact: float
    next_state_set_match: float
    next_state_f1: float
    next_state_copy_baseline: dict[str, float]  # exact, set_match and f1 of predicting s' = s
    next_state_f1_by_page: dict[str, float]  # by the page type of the real next state
    transitions_by_page: dict[str, int]
    epsilon_r: dict[str, float | None]  # mean, max, quantile, q; terminal_*; bound (used for the bounds)
    epsilon_p: float
    gamma: float
    lemma1_bound: float
    horizon: int
    finite_horizon_bound: float  # with v_max = r_max: outcome rewards, at most one reward per episode
    settings: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs))


def _majority(values: Sequence[float]) -> float:
    """The most common value; ties go to the smaller one (deterministic)."""
    counts = Counter(values)
    return min(counts, key=lambda v: (-counts[v], v))


def fidelity_report(
    records: Sequence[FidelityRecord],
    reward_tol: float = 0.1,
    quantile: float = 0.95,
    gamma: float = 0.99,
    horizon: int = 15,
    r_max: float = 1.0,
    page_type: Callable[[str], str] = one_page_type,
) -> FidelityReport:
    """Score ``records``; ε_R for the bounds is ``epsilon_r["bound"]`` (see the module docstring). Next-state F1
    is also given per ``page_type`` of the real next state (the env's :attr:`EnvSpec.page_type`)."""
    if not records:
        raise ValueError("fidelity_report: no transitions to score")
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    tol = reward_tol + 1e-9  # rewards are written with 2 decimals; keep 0.85 vs 0.75 inside a 0.1 tolerance
    valid = [r.prediction.failure is None for r in records]
    abs_err = [abs(r.prediction.reward - r.gold.reward) if ok else r_max for r, ok in zip(records, valid, strict=True)]
    reward_ok = [ok and e <= tol for ok, e in zip(valid, abs_err, strict=True)]
    exact_ok = [ok and round(r.prediction.reward, 2) == round(r.gold.reward, 2)
                for r, ok in zip(records, valid, strict=True)]
    gold_done = [terminated(r.gold) for r in records]  # a max_steps cut is not an ending M_exp should predict
    terminal = [i for i, d in enumerate(gold_done) if d]
    gold_rewards = [round(r.gold.reward, 2) for r in records]

    reward_majority = _majority(gold_rewards)
    done_majority = bool(_majority([float(d) for d in gold_done]))
    majority = majority_acc = majority_exact = None
    if terminal:
        majority = _majority([gold_rewards[i] for i in terminal])
        majority_acc = _mean([abs(records[i].gold.reward - majority) <= tol for i in terminal])
        majority_exact = _mean([gold_rewards[i] == majority for i in terminal])

    f1 = [state_token_f1(r.prediction.next_state, r.gold.next_state) if ok else 0.0
          for r, ok in zip(records, valid, strict=True)]
    set_match = [ok and element_set_match(r.prediction.next_state, r.gold.next_state)
                 for r, ok in zip(records, valid, strict=True)]
    by_page: dict[str, list[float]] = defaultdict(list)
    for r, score in zip(records, f1, strict=True):
        by_page[page_type(r.gold.next_state)].append(score)

    eps_r_q = float(np.quantile(abs_err, quantile, method="higher"))
    terminal_err = [abs_err[i] for i in terminal]
    eps_r_terminal = float(np.quantile(terminal_err, quantile, method="higher")) if terminal else None
    eps_r = max(eps_r_q, eps_r_terminal) if eps_r_terminal is not None else eps_r_q
    eps_p = 1.0 - _mean(set_match)
    return FidelityReport(
        transitions=len(records),
        reward_accuracy=_mean(reward_ok),
        reward_majority=reward_majority,
        reward_majority_baseline=_mean([abs(r.gold.reward - reward_majority) <= tol for r in records]),
        terminal_transitions=len(terminal),
        terminal_reward_accuracy=_mean([reward_ok[i] for i in terminal]) if terminal else None,
        terminal_reward_exact_accuracy=_mean([exact_ok[i] for i in terminal]) if terminal else None,
        terminal_reward_majority=majority,
        terminal_reward_majority_baseline=majority_acc,
        terminal_reward_exact_majority_baseline=majority_exact,
        reward_mae=_mean(abs_err),
        done_accuracy=_mean([ok and r.prediction.done == d for r, ok, d in zip(records, valid, gold_done, strict=True)]),
        done_majority=done_majority,
        done_majority_baseline=_mean([d == done_majority for d in gold_done]),
        invalid_output_rate=_mean([not ok for ok in valid]),
        invalid_output_reasons=dict(
            sorted(Counter(r.prediction.failure for r in records if r.prediction.failure).items())
        ),
        next_state_exact=_mean(
            [ok and next_state_exact(r.prediction.next_state, r.gold.next_state) for r, ok in zip(records, valid, strict=True)]
        ),
        next_state_set_match=_mean(set_match),
        next_state_f1=_mean(f1),
        next_state_copy_baseline={
            "exact": _mean([next_state_exact(r.gold.state, r.gold.next_state) for r in records]),
            "set_match": _mean([element_set_match(r.gold.state, r.gold.next_state) for r in records]),
            "f1": _mean([state_token_f1(r.gold.state, r.gold.next_state) for r in records]),
        },
        next_state_f1_by_page={page: _mean(scores) for page, scores in sorted(by_page.items())},
        transitions_by_page={page: len(scores) for page, scores in sorted(by_page.items())},
        epsilon_r={
            "mean": _mean(abs_err), "max": max(abs_err), "quantile": eps_r_q, "q": quantile,
            "terminal_mean": _mean(terminal_err) if terminal else None,
            "terminal_max": max(terminal_err) if terminal else None,
            "terminal_quantile": eps_r_terminal,
            "bound": eps_r,
        },
        epsilon_p=eps_p,
        gamma=gamma,
        lemma1_bound=lemma1_bound(eps_r, eps_p, gamma, r_max),
        horizon=horizon,
        finite_horizon_bound=finite_horizon_bound(eps_r, eps_p, horizon, r_max, v_max=r_max),
        settings={"reward_tol": reward_tol, "r_max": r_max},
    )
