"""What would decide an open verdict, and at what device cost: the planned look at which the runs would reach a
verdict with at least POWER chance at the spread measured, or, where no planned look can, what would (a wider margin
in the metric's own units that the runs can confirm, or a longer study).

The chance is that of a verdict, either one: equivalent (two one-sided tests at the margin) or divergent (the test of
no difference at the test's share of the family's alpha), predictive: averaged over what the true difference and
spread may be given the runs so far, not the measured ones taken as true (which, from a few runs, stated 92 % where
the advised look decided 59 % of the time: benchmarks/advice_followed.py measures the rate stated against the rate
reached). A look whose chance is below FLOOR is never advised."""

import math
import statistics

from .margins import LOG_SCALE
from .sequential import ALPHA, LOOKS, boundaries, sd_shrink
from .verdict import INCONCLUSIVE

POWER = 0.8  # the chance of a verdict the advice aims for
DRAWS, SEED = 20000, 20261208  # the predictive chance's draws, fixed: a report says the same each time it is made
FLOOR = 0.5  # below this chance a look is not advised


def _normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _z(p: float) -> float:
    from scipy.special import ndtri

    return float(ndtri(p))


def chance(result: dict, runs: int, *, family: int | None = None, alpha: float = ALPHA) -> dict:
    """At the planned look of `runs` pairs, the predictive chance that the verdict of `result` (verdict.judge's) is
    equivalent, divergent, and either: over DRAWS draws of the true mean difference and spread given the pairs judged
    (a flat prior: the spread from its scaled chi-square, the mean from its normal about the mean measured), the
    pairs still to come simulated and judged with the pairs already there, as the verdict will judge them."""
    import numpy as np

    index = LOOKS.index(runs)
    n0, mean, spread, spec = result["runs_judged"], result["difference"], result["difference_sd"], result["margin_spec"]
    bound = result["margin"]
    if "sd" in spec:  # the margin's SD estimate as now, its lower bound at that look
        now = sd_shrink(result["look"] - 1, alpha / 2) if result.get("look") else 1.0
        bound = bound / now * sd_shrink(index, alpha / 2)
    share = alpha / (family or result.get("family_size") or 1)
    rng = np.random.default_rng(SEED)
    sigma = spread * np.sqrt((n0 - 1) / rng.chisquare(n0 - 1, DRAWS)) if spread > 0 else np.zeros(DRAWS)
    mu = mean + sigma / math.sqrt(n0) * rng.standard_normal(DRAWS)
    k = runs - n0
    added = k * mu + np.sqrt(k) * sigma * rng.standard_normal(DRAWS)  # the sum of the pairs to come
    within = sigma ** 2 * (rng.chisquare(k - 1, DRAWS) if k > 1 else np.zeros(DRAWS))  # their squares about their mean
    total = (n0 * mean + added) / runs
    squares = (n0 - 1) * spread ** 2 + within + n0 * (mean - total) ** 2 + \
        (k * (added / k - total) ** 2 if k else 0.0)
    se = np.sqrt(squares / (runs - 1) / runs)
    z = boundaries(alpha / 2 if "sd" in spec else alpha, sides=1)[index]
    equivalent = np.abs(total) + z * se < bound
    divergent = np.abs(total) > boundaries(share)[index] * se
    return {"runs": runs, "equivalent": float(equivalent.mean()), "divergent": float(divergent.mean()),
            "either": float((equivalent | divergent).mean())}


def confirmable(result: dict, runs: int = LOOKS[-1], *, alpha: float = ALPHA) -> float | None:
    """The margin, on the summary's scale, that `runs` pairs would show the difference within with POWER chance at
    the spread and difference measured: the margin a study could set to decide it."""
    spread = result.get("difference_sd")
    if spread is None:
        return None
    index = LOOKS.index(runs) if runs in LOOKS else len(LOOKS) - 1
    z = boundaries(alpha, sides=1)[index]
    return abs(result["difference"]) + (z + _z(POWER)) * spread / math.sqrt(runs)


def run_cost(runs: list[dict]) -> float | None:
    """The device time of one run, from the study's own runs: the median of start-up plus training (seconds)."""
    times = [r["train_wall_s"] + (r.get("startup_s") or 0.0) for r in runs if r.get("train_wall_s") is not None]
    return statistics.median(times) if times else None


def advise(metric: str, result: dict, *, reference_cost: float | None = None,
           candidate_cost: float | None = None) -> dict | None:
    """For an open verdict: the first later planned look with at least POWER chance of a verdict (its runs, chance
    and the added device time of both backends), else the best later look if its chance reaches FLOOR, and where
    no planned look reaches POWER, the margin the last look could confirm in the metric's terms. None where the
    verdict is not open or has no spread."""
    if result.get("verdict") != INCONCLUSIVE or result.get("difference_sd") is None or "margin" not in result:
        return None
    done = result.get("look_runs") or 0
    later = [chance(result, n) for n in LOOKS if n > done]
    good = next((c for c in later if c["either"] >= POWER), None)
    best = max(later, key=lambda c: c["either"], default=None)
    pick = good or (best if best and best["either"] >= FLOOR else None)
    out = {"metric": metric, "look": pick, "reaches_power": good is not None, "best": best}
    if pick:
        more = pick["runs"] - max(done, result.get("runs_judged", 0))
        costs = [c for c in (reference_cost, candidate_cost) if c is not None]
        out["more_runs"] = more
        out["device_s"] = more * sum(costs) if len(costs) == 2 else None
    if good is None:
        wider = confirmable(result)
        if wider is not None:
            out["confirmable"] = math.exp(wider) if metric in LOG_SCALE else wider
            out["confirmable_scale"] = "ratio" if metric in LOG_SCALE else "difference"
    return out


def words(found: dict | None) -> str | None:
    """The advice in a sentence; None where there is none."""
    if not found:
        return None
    said = []
    look = found["look"]
    if look:
        cost = f", about {hours(found['device_s'])} of device time" if found.get("device_s") else ""
        said.append(f"{look['runs']} runs of each backend ({found['more_runs']} more{cost}) decide it "
                    f"{100 * look['either']:.0f} % of the time")
    else:
        best = found["best"]
        said.append("no planned look decides it" + (f" (at {best['runs']} runs, {100 * best['either']:.0f} %)"
                                                    if best else ""))
    if "confirmable" in found:
        value = found["confirmable"]
        margin = f"{value:.2f}x" if found["confirmable_scale"] == "ratio" else f"{value:.3g}"
        said.append(f"a margin of {margin} would be confirmed by {LOOKS[-1]} runs {100 * POWER:.0f} % of the time")
    return "; ".join(said)


def hours(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
