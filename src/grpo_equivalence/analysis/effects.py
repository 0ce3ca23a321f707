"""A verdict's difference in the metric's own terms, with its interval: what a user weighs a switch by.

The interval is the repeated confidence interval of the look the verdict was read at (verdict.judge): built from the
two-sided boundary of the whole alpha over the planned looks, so that the intervals a user reads at every look cover
the true paired difference together with chance at least 1 - alpha (docs/verdicts.md measures it). The metrics
summarised as logs (kl, grad_norm) are said as a ratio of the candidate's to the reference's, the others as a
difference of the run summaries in the metric's units."""

import math

from .margins import LOG_SCALE

RATIO, DIFFERENCE = "ratio", "difference"


def effect(metric: str, result: dict) -> dict | None:
    """The paired effect of `result` (a verdict of `metric`) and its interval, on the metric's scale; None where the
    verdict has none (not logged, fewer than two pairs, before the first look)."""
    if "interval" not in result:
        return None
    low, high = result["interval"]
    estimate = result["difference"]
    if metric in LOG_SCALE:
        return {"scale": RATIO, "estimate": math.exp(estimate), "low": math.exp(low), "high": math.exp(high),
                "level": result["interval_level"], "runs": result["runs_judged"]}
    return {"scale": DIFFERENCE, "estimate": estimate, "low": low, "high": high, "level": result["interval_level"],
            "runs": result["runs_judged"]}


def _number(value: float, scale: str) -> str:
    return f"{value:.2f}x" if scale == RATIO else f"{value:+.3g}"


def words(found: dict | None) -> str:
    """"0.78x (0.68 to 0.89)", "+0.012 (-0.003 to +0.027)"; "no interval" where there is none."""
    if not found:
        return "no interval"
    scale = found["scale"]
    if scale == RATIO:
        return f"{found['estimate']:.2f}x ({found['low']:.2f} to {found['high']:.2f})"
    return f"{_number(found['estimate'], scale)} ({_number(found['low'], scale)} to {_number(found['high'], scale)})"


def ruled_out(found: dict | None) -> str | None:
    """What the interval already rules out, as one bound: "a change beyond 1.40x either way" (a ratio), "a difference
    beyond 0.031 either way" (units); None without an interval. The bound is the interval's end farthest from no
    change, so every change beyond it, in either direction, lies outside the interval."""
    if not found:
        return None
    if found["scale"] == RATIO:
        far = math.exp(max(abs(math.log(found["low"])), abs(math.log(found["high"]))))
        return f"a change beyond {far:.2f}x either way"
    return f"a difference beyond {max(abs(found['low']), abs(found['high'])):.3g} either way"
