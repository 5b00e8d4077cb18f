"""Statistics of the bench (``dreamgym bench``): numpy only, seeded, so that a table is reproducible.

* :func:`bootstrap_ci`: the mean and a 95% percentile CI by a two-level bootstrap over seeds and tasks: each
  resample draws the seeds with replacement, then the tasks (episodes) within each drawn seed with replacement,
  and takes the mean over all drawn values. It thus carries the seed-to-seed variance (the training runs) as well
  as the task sample's.
* :func:`paired_bootstrap_ci`: the same on per-task differences ``a - b`` of two methods evaluated on the same
  tasks (same seed, same seeded task order): a paired comparison.
* :func:`sign_test`: the two-sided exact sign test (binomial, p = 1/2) on the discordant pairs (ties dropped).
* :func:`wilson_interval`: the 95% Wilson score interval of a share (one run's accuracy on n examples).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb

import numpy as np

RESAMPLES = 2000
SEED = 0


def _groups(values: Sequence[Sequence[float]]) -> list[np.ndarray]:
    groups = [np.asarray(v, dtype=float) for v in values]
    if not groups or any(g.size == 0 for g in groups):
        raise ValueError("the bootstrap needs at least one seed and one task per seed")
    return groups


def bootstrap_ci(values: Sequence[Sequence[float]], resamples: int = RESAMPLES, seed: int = SEED,
                 level: float = 0.95) -> dict[str, float]:
    """``values[s][t]``: seed s's value on task t. Returns ``{mean, ci_low, ci_high}``: the mean over all values
    and the ``level`` percentile interval of the two-level (seeds, then tasks within each seed) bootstrap."""
    groups = _groups(values)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for i in range(resamples):
        picked = rng.integers(len(groups), size=len(groups))
        total = count = 0.0
        for s in picked:
            g = groups[s]
            total += float(g[rng.integers(g.size, size=g.size)].sum())
            count += g.size
        means[i] = total / count
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    mean = float(np.concatenate(groups).mean())
    # a constant sample's resample means are the constant up to rounding: keep the interval exact around the mean
    return {"mean": mean, "ci_low": min(float(low), mean), "ci_high": max(float(high), mean)}


def paired_bootstrap_ci(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], resamples: int = RESAMPLES,
                        seed: int = SEED, level: float = 0.95) -> dict[str, float]:
    """:func:`bootstrap_ci` of the per-task differences ``a[s][t] - b[s][t]`` (the same tasks in each seed)."""
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b, strict=True)):
        raise ValueError("a paired comparison needs the same seeds and tasks on both sides")
    diffs = [np.asarray(x, dtype=float) - np.asarray(y, dtype=float) for x, y in zip(a, b, strict=True)]
    return bootstrap_ci(diffs, resamples, seed, level)


def sign_test(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Two-sided exact sign test of paired ``a`` vs ``b``: ``{a_better, b_better, p}``, where the pairs with
    ``a > b`` and ``a < b`` are the discordant ones (ties dropped) and p = P(|X - n/2| >= |k - n/2|),
    X ~ Binomial(n, 1/2); 1 when no pair is discordant."""
    if len(a) != len(b):
        raise ValueError("a sign test needs paired samples of one length")
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    wins, losses = int((x > y).sum()), int((x < y).sum())
    n = wins + losses
    k = min(wins, losses)
    p = 1.0 if n == 0 else min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n)
    return {"a_better": wins, "b_better": losses, "p": p}


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of ``successes / n`` (95% at the default ``z``), in closed form (the formula
    statsmodels' ``proportion_confint(method="wilson")`` computes; not worth a dependency). Unlike the normal
    approximation it stays inside [0, 1] and is sensible for shares near 0 or 1 and for small n."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"a Wilson interval needs 0 <= successes <= n and n > 0 (got {successes} of {n})")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


__all__ = ["RESAMPLES", "SEED", "bootstrap_ci", "paired_bootstrap_ci", "sign_test", "wilson_interval"]
