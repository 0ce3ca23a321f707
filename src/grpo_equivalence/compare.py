"""A candidate run against the reference run, step by step."""

import math

from .stats import StatsError

COMPARED = ("loss", "reward", "kl", "grad_norm")  # the metrics the report judges, in its column order
NOT_LOGGED = "not logged"


def _series(stats: dict, metric: str, label: str) -> list[float] | None:
    """The metric at every step, None if never logged; a metric logged at some steps only is an error."""
    values = [step.get(metric) for step in stats["steps"]]
    if all(v is None for v in values):
        return None
    for step, value in zip(stats["steps"], values, strict=True):
        if value is None:
            raise StatsError(f"{label}: {metric} is logged at some steps but missing at step {step['step']}")
        if not math.isfinite(value):
            raise StatsError(f"{label}: {metric} is {value} at step {step['step']}; the run diverged, so it cannot be "
                             f"compared (rerun it, or lower the learning rate)")
    return values


def _label(stats: dict) -> str:
    return f"{stats['backend']} x {stats['max_steps']}"


def compare(reference: dict, candidate: dict) -> dict:
    """Per metric, max and mean |candidate - reference| over aligned steps, or NOT_LOGGED (never 0)."""
    ref_label, cand_label = _label(reference), _label(candidate)
    ref_steps = [s["step"] for s in reference["steps"]]
    cand_steps = [s["step"] for s in candidate["steps"]]
    if ref_steps != cand_steps:
        raise StatsError(f"{cand_label} has {len(cand_steps)} steps, {ref_label} has {len(ref_steps)}: runs of "
                         f"different length cannot be compared step by step; rerun the shorter one")
    metrics = {}
    for metric in COMPARED:
        ref = _series(reference, metric, ref_label)
        cand = _series(candidate, metric, cand_label)
        if ref is None or cand is None:
            missing = [label for label, series in ((ref_label, ref), (cand_label, cand)) if series is None]
            metrics[metric] = {"status": NOT_LOGGED, "not_logged_in": missing}
            continue
        diffs = [abs(c - r) for c, r in zip(cand, ref, strict=True)]
        metrics[metric] = {"status": "compared", "max_abs_diff": max(diffs), "mean_abs_diff": sum(diffs) / len(diffs),
                           "at_step": ref_steps[diffs.index(max(diffs))]}
    return {"reference": reference["backend"], "candidate": candidate["backend"], "max_steps": reference["max_steps"],
            "steps_compared": len(ref_steps), "metrics": metrics}
