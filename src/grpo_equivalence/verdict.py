"""Is a candidate backend's training the same as the reference's? A verdict per metric, against the noise
that reseeding alone causes.

The unit of evidence is the run (one seed), not the step: the steps of one run share its seed's fate (its
LoRA initialisation, its early samples), so they are not independent evidence. Each run is summarised per
metric by its mean over all its steps, and the runs of different seeds give the seed-to-seed standard
deviation s of that mean (pooled over both backends, Student's t with k + m - 2 degrees of freedom for k
reference and m candidate runs). With d the difference of the two backends' mean run means:

- equivalent: Wellek's exact t-test of equivalence rejects |d| >= margin x sqrt(2) x s (a difference as large
  as `margin` standard deviations of the difference between two seeds) at `alpha`;
- divergent: otherwise, if Student's two-sided t-test rejects d = 0 at alpha / tests (Bonferroni over the
  metrics judged together, so that a backend that is another seed of the reference is called divergent on
  any of them at most alpha of the time);
- inconclusive: neither, with the number of runs per backend that would settle it if the difference and
  the noise stayed as measured; also with fewer than two reference runs (no noise floor to judge against);
- not logged: a run lacks the metric (never 0).

A NaN, a missing step or runs of different lengths are errors (StatsError), never a verdict.
"""

import math
import statistics
from functools import lru_cache

from .runs import METRIC_KEYS, label, series
from .stats import StatsError

METRICS = tuple(METRIC_KEYS)  # the metrics judged, in the report's column order
EQUIVALENT, DIVERGENT, INCONCLUSIVE, NOT_LOGGED = "equivalent", "divergent", "inconclusive", "not logged"
ALPHA = 0.05
MARGIN = 1.0  # in standard deviations of a seed-to-seed difference
MAX_RUNS = 200  # beyond this, "more runs" is no advice


@lru_cache(maxsize=4096)
def _t_quantile(p: float, df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(p, df))


def _two_sided_p(t_value: float, df: int) -> float:
    from scipy.stats import t

    return float(2 * t.sf(abs(t_value), df))


@lru_cache(maxsize=4096)
def equivalence_bound(df: int, noncentrality: float, alpha: float) -> float:
    """Wellek's critical value C: |T| < C shows equivalence, where P(|T| < C) = alpha for T following the
    noncentral t of `df` degrees of freedom at the margin's noncentrality."""
    from scipy.optimize import brentq
    from scipy.stats import nct

    def coverage(c):
        return nct.cdf(c, df, noncentrality) - nct.cdf(-c, df, noncentrality) - alpha

    high = noncentrality + 1.0
    while not coverage(high) > 0:  # widen until the interval holds more than alpha
        high *= 2
    return float(brentq(coverage, 0.0, high))


def _settles(effect: float, k: int, m: int, *, alpha: float, margin: float, tests: int) -> str | None:
    """The verdict that k reference and m candidate runs give for a standardised difference `effect`."""
    df, scale = k + m - 2, math.sqrt(1 / k + 1 / m)
    t_value = effect / scale
    if abs(t_value) < equivalence_bound(df, margin * math.sqrt(2) / scale, alpha):
        return EQUIVALENT
    if abs(t_value) > _t_quantile(1 - alpha / (2 * tests), df):
        return DIVERGENT
    return None


def runs_needed(effect: float, k: int, m: int, *, alpha: float, margin: float, tests: int) -> tuple[str, int] | None:
    """The verdict more runs would most likely give, and how many runs of each backend that takes, if the
    standardised difference stayed as measured (None: not within MAX_RUNS)."""
    for n in range(max(k, m) + 1, MAX_RUNS + 1):
        outcome = _settles(effect, max(k, n), max(m, n), alpha=alpha, margin=margin, tests=tests)
        if outcome is not None:
            return outcome, n
    return None


def judge(reference_means: list[float], candidate_means: list[float], *, alpha: float = ALPHA,
          margin: float = MARGIN, tests: int = 1) -> dict:
    """The verdict on one metric from the run means of the reference's and the candidate's runs; `tests` is
    the number of metrics judged together (the Bonferroni divisor of the divergence test)."""
    k, m = len(reference_means), len(candidate_means)
    if m < 1:
        raise ValueError("no candidate run to judge")
    difference = statistics.fmean(candidate_means) - statistics.fmean(reference_means)
    evidence = {"reference_runs": k, "candidate_runs": m, "difference": difference}
    if k < 2:
        return {**evidence, "verdict": INCONCLUSIVE, "needed_runs": 2,
                "reason": f"{k} reference run: the noise floor needs at least 2 seeds of the reference "
                          f"(set replicates.reference)"}
    ss = (k - 1) * statistics.variance(reference_means) + ((m - 1) * statistics.variance(candidate_means) if m > 1 else 0.0)
    s = math.sqrt(ss / (k + m - 2))
    evidence.update(noise_sd=statistics.stdev(reference_means), pooled_sd=s, margin=margin * math.sqrt(2) * s)
    if s == 0:
        verdict = EQUIVALENT if difference == 0 else DIVERGENT
        return {**evidence, "verdict": verdict, "p_value": 1.0 if difference == 0 else 0.0,
                "reason": "every run has the same mean: " + ("no difference" if difference == 0 else "any difference is one")}
    df, scale = k + m - 2, math.sqrt(1 / k + 1 / m)
    t_value = difference / (s * scale)
    evidence.update(t=t_value, df=df, p_value=_two_sided_p(t_value, df))
    outcome = _settles(difference / s, k, m, alpha=alpha, margin=margin, tests=tests)
    if outcome == EQUIVALENT:
        return {**evidence, "verdict": EQUIVALENT, "reason": f"within {margin:g} seed-to-seed SD of a difference "
                                                             f"(equivalence test, alpha {alpha:g})"}
    if outcome == DIVERGENT:
        return {**evidence, "verdict": DIVERGENT,
                "reason": f"p = {evidence['p_value']:.2g} < {alpha:g}/{tests}" if tests > 1 else f"p = {evidence['p_value']:.2g} < {alpha:g}"}
    needed = runs_needed(difference / s, k, m, alpha=alpha, margin=margin, tests=tests)
    if needed is None:
        return {**evidence, "verdict": INCONCLUSIVE, "needed_runs": None,
                "reason": f"even {MAX_RUNS} runs of each backend would not settle it"}
    result, n = needed
    return {**evidence, "verdict": INCONCLUSIVE, "needed_runs": n, "needed_for": result,
            "reason": f"{n} runs of each backend would likely show it {result}, if the difference and noise stayed "
                      f"as measured"}


def judge_runs(reference_runs: list[dict], candidate_runs: list[dict], metric: str, *, alpha: float = ALPHA,
               margin: float = MARGIN, tests: int = 1) -> dict:
    """The verdict on `metric` from whole runs (all of one step count): their per-step series, checked."""
    lengths = {len(run["steps"]) for run in [*reference_runs, *candidate_runs]}
    if len(lengths) > 1:
        counts = ", ".join(f"{label(r)} has {len(r['steps'])}" for r in [*reference_runs, *candidate_runs])
        raise StatsError(f"runs of different length cannot be compared step by step: {counts}; rerun the shorter")
    missing = [label(r) for r in [*reference_runs, *candidate_runs] if series(r, metric) is None]
    if missing:
        return {"verdict": NOT_LOGGED, "not_logged_in": missing, "reason": f"not logged in {', '.join(missing)}"}
    means = [[statistics.fmean(series(r, metric)) for r in runs] for runs in (reference_runs, candidate_runs)]
    return judge(*means, alpha=alpha, margin=margin, tests=tests)


def noise_floor(reference_runs: list[dict], metric: str) -> dict | None:
    """Per step, how far the reference's runs of different seeds are apart: their mean, lowest and highest
    value, and the mean distance between two of them. None where not logged or fewer than two runs."""
    curves = [series(r, metric) for r in reference_runs]
    if len(curves) < 2 or any(c is None for c in curves):
        return None
    per_step = list(zip(*curves, strict=True))
    pairs = [(i, j) for i in range(len(curves)) for j in range(i + 1, len(curves))]
    return {
        "runs": len(curves),
        "mean": [statistics.fmean(v) for v in per_step],
        "low": [min(v) for v in per_step],
        "high": [max(v) for v in per_step],
        "pairwise_abs_diff": [statistics.fmean(abs(v[i] - v[j]) for i, j in pairs) for v in per_step],
    }
