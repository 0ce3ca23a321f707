"""How close a candidate's metric must be to the reference's to count as the same: a margin per metric, fixed before
any run is judged with it (a study's verdict.margins, else DEFAULT_MARGINS, else MARGIN seed SDs), in the terms a
practitioner states it: a ratio for the metrics summarised as logs, an absolute value in the summary's units, or
standard deviations of a seed-to-seed difference of the reference's runs."""

import math
import statistics

from .sequential import ALPHA, sd_shrink

MARGIN = 1.0  # in standard deviations of a seed-to-seed difference of the reference's runs
# The margins a study gets unless it sets its own (verdict.margins), fixed before any run was judged with them: KL and
# grad_norm, summarised as logs, within a ratio (a policy drifting from the reference 1.5 times as far, or updates a
# quarter larger, is no longer the same training); every other metric within MARGIN seed-to-seed SDs of the reference.
DEFAULT_MARGINS = {"kl": {"ratio": 1.5}, "grad_norm": {"ratio": 1.25}}
LOG_SCALE = ("kl", "grad_norm")  # the metrics whose summary is a log: the ones a ratio margin applies to


def margin_spec(metric: str, margins: dict | None = None, sd: float = MARGIN) -> dict:
    """How close `metric` must be to count as the same: the study's `margins` entry for it (reward functions: theirs
    or `reward_functions`'), else DEFAULT_MARGINS', else `sd` standard deviations of a seed-to-seed difference."""
    margins = margins or {}
    for key in (metric, "reward_functions" if metric.startswith("rewards/") else None):
        if key in margins:
            return dict(margins[key])
    return dict(DEFAULT_MARGINS.get(metric, {"sd": sd}))


def margin_words(metric: str, spec: dict) -> str:
    """The margin in plain words, as the report prints it ("kl within 1.5x")."""
    kind, value = next(iter(spec.items()))
    if kind == "ratio":
        return f"{metric} within {value:g}x"
    if kind == "absolute":
        return f"{metric} within {value:g}"
    return f"{metric} within {value:g} SD of a seed-to-seed difference of the reference"


def margin_bound(spec: dict, reference_values: list[float], index: int | None = None, alpha: float = ALPHA) -> float:
    """The margin on the summary's scale: log(ratio) (ratio margins are for metrics summarised as logs), the
    absolute value, or sd x sqrt(2) x the SD of the reference's runs (its own seeds only: a noisy candidate does
    not widen it), at a planned look (`index`) its lower confidence bound (sequential.sd_shrink, alpha / 2: the
    other half goes to the equivalence test, so that an estimated margin keeps the false-equivalence rate)."""
    kind, value = next(iter(spec.items()))
    if kind == "ratio":
        return math.log(value)
    if kind == "absolute":
        return float(value)
    return sd_margin(value, statistics.stdev(reference_values), index, alpha)


def sd_margin(value: float, sd, index: int | None = None, alpha: float = ALPHA):
    """`value` seed-to-seed SDs of a difference from the SD of the reference's runs (a number, or an array of them),
    at a planned look its lower confidence bound."""
    return value * math.sqrt(2) * sd * (sd_shrink(index, alpha / 2) if index is not None else 1.0)


def equivalence_alpha(spec: dict, alpha: float) -> float:
    """The alpha of the two one-sided tests at the margin: all of it for a fixed margin, half for an estimated one."""
    return alpha / 2 if "sd" in spec else alpha
