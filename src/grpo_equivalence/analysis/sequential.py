"""The training verdict's planned looks and the tests' arithmetic: the boundary of the paired t statistic at each
look (alpha spent over the looks), Holm's weighted step-down over a family of tests at those boundaries, and the
t quantiles. verdict says how a difference is judged with them."""

import bisect
import json
import math
from functools import lru_cache
from pathlib import Path

ALPHA = 0.05
LOOKS = (3, 5, 8, 12)  # runs per backend at which a verdict is planned; alpha spent in proportion to the runs


BOUNDARIES = Path(__file__).with_name("boundaries.json")  # written by benchmarks/verdict_boundaries.py
SIMULATED_FROM = 1e-3  # the smallest level the table holds; below it each look spends its own share (Bonferroni)


def simulate_boundaries(levels: list[float], paths: int, seed: int,
                        looks: tuple[int, ...] = LOOKS) -> dict[str, list[list[float]]]:
    """The critical |t| at each planned look of a two-sided paired t-test at each of `levels`, alpha spent over the
    looks in proportion to their runs (level x n_k / n_last by look k; Lan and DeMets' spending, for t statistics,
    whose degrees of freedom change from look to look: z boundaries applied to them spend more than planned): the
    first look's from the t distribution exactly, each later one the quantile of `paths` simulated null paths not
    stopped before. The paths are sequences of independent standard normal differences: the t statistics' joint
    distribution at nested looks depends neither on the differences' mean (under the null, or shifted to a margin)
    nor on their spread, so for normal differences the boundaries hold for any correlation of the paired runs and any
    ratio of their variances (other shapes: docs/verdicts.md#calibration measures them). One-sided (the equivalence tests at a margin): the boundary below which the statistic falls at look k
    and at no look before with chance level x n_k / n_last, whatever it did above; two-sided: |t|."""
    import numpy as np

    rng = np.random.default_rng(seed)
    statistic = np.empty((paths, len(looks)), dtype=np.float32)
    for start in range(0, paths, 250_000):
        x = rng.standard_normal((min(250_000, paths - start), looks[-1]))
        sums, squares = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
        for j, n in enumerate(looks):
            mean = sums[:, n - 1] / n
            variance = (squares[:, n - 1] - n * mean ** 2) / (n - 1)
            statistic[start:start + len(x), j] = mean / np.sqrt(variance / n)
    tables = {"two_sided": [], "one_sided": []}
    for sides, table in ((2, tables["two_sided"]), (1, tables["one_sided"])):
        beyond = np.abs(statistic) if sides == 2 else -statistic  # the one-sided test looks below: -t above
        for level in levels:
            alive, critical, previous = np.ones(paths, dtype=bool), [], 0
            for j, n in enumerate(looks):
                spend = level * (n - previous) / looks[-1]
                previous = n
                if j == 0:
                    c = t_quantile(1 - spend / sides, n - 1)
                else:
                    inside = beyond[alive, j]
                    share = spend * paths / len(inside)  # of the paths still running, the share that crosses here
                    c = float(np.quantile(inside, 1 - share)) if share < 1 else -math.inf
                critical.append(c)
                alive &= beyond[:, j] <= c
            table.append(critical)
    return tables


@lru_cache(maxsize=1)
def _table() -> dict:
    table = json.loads(BOUNDARIES.read_text())
    if tuple(table["looks"]) != LOOKS:
        raise RuntimeError(f"{BOUNDARIES} holds the boundaries of looks {table['looks']}, not of {LOOKS}: run "
                           f"python benchmarks/verdict_boundaries.py to simulate them")
    return table


@lru_cache(maxsize=4096)
def boundaries(level: float, looks: tuple[int, ...] = LOOKS, sides: int = 2) -> tuple[float, ...]:
    """The critical value at each planned look for a test at `level` over the looks (simulate_boundaries), |t| for
    two sides, -t for one: from the simulated table, interpolated in log(level), for levels from SIMULATED_FROM to 1;
    below it, each look's own share of the level at the t quantile, which spends no more than planned whatever the
    looks' overlap."""
    if not 0 < level <= 1:
        raise ValueError(f"a level is between 0 and 1, not {level}")
    first = t_quantile(1 - level * looks[0] / looks[-1] / sides, looks[0] - 1)  # the first look's, exactly
    if looks != LOOKS or level < SIMULATED_FROM:
        previous, out = 0, []
        for n in looks:
            out.append(t_quantile(1 - level * (n - previous) / looks[-1] / sides, n - 1))
            previous = n
        return tuple(out)
    table = _table()
    critical = table["two_sided" if sides == 2 else "one_sided"]
    x = [math.log(v) for v in table["levels"]]
    i = min(max(bisect.bisect_left(x, math.log(level)) - 1, 0), len(x) - 2)
    w = (math.log(level) - x[i]) / (x[i + 1] - x[i])
    return (first, *[(1 - w) * a + w * b for a, b in zip(critical[i][1:], critical[i + 1][1:], strict=True)])


def nominal(level: float, index: int, looks: tuple[int, ...] = LOOKS) -> float:
    """The two-sided p-value a test must reach at look `index` (0-based) for `level` over the planned looks."""
    return two_sided_p(boundaries(level, looks)[index], looks[index] - 1)


def look(runs: int, alpha: float = ALPHA) -> dict:
    """The planned look `runs` pairs of runs reach (the last planned look at or below it: runs beyond it wait for the
    next look, whose verdict a user reading at any number of runs cannot change), its nominal two-sided p for
    alpha, and the next look. Before the first look: the first look's."""
    index = sum(1 for n in LOOKS if n <= runs)
    return {"look": index, "looks": len(LOOKS), "look_runs": LOOKS[index - 1] if index else None,
            "alpha": nominal(alpha, max(index - 1, 0)), "next_runs": LOOKS[index] if index < len(LOOKS) else None}


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: int) -> float:
    from scipy.special import stdtrit  # the t distribution's quantile, without scipy.stats' per-call overhead

    return float(stdtrit(df, p))


def two_sided_p(t_value: float, df: int) -> float:
    from scipy.special import stdtr

    return float(2 * stdtr(df, -abs(t_value)))


def holm(p_values: list[float], alpha: float, weights: list[float] | None = None, threshold=None) -> list[bool]:
    """Holm's step-down, weighted (Holm 1979), as a graphical procedure over group sequential tests (Maurer and
    Bretz 2013): which hypotheses are rejected, family-wise error at most alpha. Each hypothesis holds alpha x its
    weight over the weights left; it is rejected where its p reaches threshold(i, level), the nominal p of its test
    at this look for that level (default: the level itself, one fixed-size test), and its weight passes to the
    others. Equal weights and the default threshold give the plain procedure."""
    weights = weights or [1.0] * len(p_values)
    threshold = threshold or (lambda i, level: level)
    order = sorted(range(len(p_values)), key=lambda i: p_values[i] / weights[i])
    rejected, left = [False] * len(p_values), sum(weights)
    progress = True
    while progress:  # the rejected set does not depend on the order rejections are made in (consonant weights)
        progress = False
        for i in order:
            if not rejected[i] and p_values[i] <= threshold(i, alpha * weights[i] / left):
                rejected[i], left, progress = True, left - weights[i], True
                break
    return rejected


@lru_cache(maxsize=256)
def sd_shrink(index: int, level: float, looks: tuple[int, ...] = LOOKS) -> float:
    """The factor that turns the SD of the reference's runs at look `index` into a lower confidence bound of the true
    SD, `level` spent over the looks in proportion to their runs (Bonferroni: the bound holds at every look at once
    with chance at least 1 - level). A margin in seed SDs is only as sure as that SD: where the candidate differs
    from the reference by little more than a constant, its equivalence rests on the SD estimate alone."""
    from scipy.special import chdtri  # the chi-square quantile

    n = looks[index]
    spend = level * (n - (looks[index - 1] if index else 0)) / looks[-1]
    return math.sqrt((n - 1) / float(chdtri(n - 1, spend)))
