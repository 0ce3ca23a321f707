"""The training verdict's planned looks and the tests' arithmetic: the alpha spent at each look (a group
sequential boundary), Holm's weighted step-down over a family of tests, and the t and noncentral F quantiles
the paired and unpaired tests use. verdict says how a difference is judged with them."""

import math
from functools import lru_cache

ALPHA = 0.05
LOOKS = (3, 5, 8, 12)  # runs per backend at which a verdict is planned; alpha spent in proportion to the runs


@lru_cache(maxsize=16)
def look_alphas(alpha: float = ALPHA, looks: tuple[int, ...] = LOOKS, points: int = 4001) -> tuple[float, ...]:
    """Each planned look's nominal two-sided alpha: the group sequential boundary c_k of a z-statistic observed
    at the looks (its values at n_i and n_j runs correlated sqrt(n_i / n_j), as means over nested runs are),
    such that the chance to cross it at look k and not before is alpha x (n_k - n_(k-1)) / n_last; the nominal
    alpha is 2(1 - Phi(c_k)). Computed exactly at the first look and, after it, by carrying the sum's density
    inside the boundaries from look to look on a grid (Armitage, McPherson and Rowe's recursion): deterministic,
    the spending within 1e-4 of the plan (tests/test_verdict.py checks it against multivariate normal
    probabilities)."""
    import numpy as np
    from scipy.optimize import brentq
    from scipy.stats import norm

    grid = np.linspace(-10.0, 10.0, points)
    mass_at, mass = np.zeros(1), np.ones(1)  # the sum's distribution before the first look: all at 0
    previous, nominal = 0.0, []
    for k, n in enumerate(looks):
        t, sd = n / looks[-1], math.sqrt((n - (looks[k - 1] if k else 0)) / looks[-1])

        def crossing(c: float) -> float:  # the chance to be beyond +-c sqrt(t) now, inside before
            b = c * math.sqrt(t)
            return float(mass @ (norm.cdf((-b - mass_at) / sd) + norm.sf((b - mass_at) / sd)))

        spend = alpha * t - previous
        bound = brentq(lambda c: crossing(c) - spend, 0.1, 8.0, xtol=1e-10)
        inside = np.abs(grid) < bound * math.sqrt(t)
        density = norm.pdf((grid[inside][:, None] - mass_at[None, :]) / sd) @ mass / sd
        mass_at, mass = grid[inside], density * (grid[1] - grid[0])
        previous = alpha * t
        nominal.append(float(2 * norm.sf(bound)))
    return tuple(nominal)


def look(runs: int, alpha: float = ALPHA) -> dict:
    """The planned look a verdict at `runs` runs per backend belongs to, its alpha (before the first look: the
    first look's), and the next look."""
    index = sum(1 for n in LOOKS if n <= runs)
    return {"look": index, "looks": len(LOOKS), "alpha": look_alphas(alpha)[max(index - 1, 0)],
            "next_runs": LOOKS[index] if index < len(LOOKS) else None}


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: int) -> float:
    from scipy.special import stdtrit  # the t distribution's quantile, without scipy.stats' per-call overhead

    return float(stdtrit(df, p))


def two_sided_p(t_value: float, df: int) -> float:
    from scipy.special import stdtr  # the t distribution's cdf: a microsecond where scipy.stats' t.sf takes 70

    return float(2 * stdtr(df, -abs(t_value)))


@lru_cache(maxsize=4096)
def equivalence_bound(df: int, noncentrality: float, alpha: float) -> float:
    """Wellek's critical value C: |T| < C shows equivalence, where P(|T| < C) = alpha for T following the
    noncentral t of `df` degrees of freedom at the margin's noncentrality. T^2 follows the noncentral F(1, df)
    with noncentrality noncentrality^2, whose quantile is finite where the noncentral t's cdf is not."""
    from scipy.stats import ncf

    return float(math.sqrt(ncf.ppf(alpha, 1, df, noncentrality ** 2)))


def holm(p_values: list[float], alpha: float, weights: list[float] | None = None) -> list[bool]:
    """Holm's step-down, weighted (Holm 1979): which hypotheses are rejected, family-wise error at most alpha. The
    hypothesis of the smallest p / weight among those left is rejected while its p is at most alpha x its weight
    over the weights left; equal weights give the plain procedure."""
    weights = weights or [1.0] * len(p_values)
    order = sorted(range(len(p_values)), key=lambda i: p_values[i] / weights[i])
    rejected, left = [False] * len(p_values), sum(weights)
    for i in order:
        if p_values[i] > alpha * weights[i] / left:
            break
        rejected[i], left = True, left - weights[i]
    return rejected

