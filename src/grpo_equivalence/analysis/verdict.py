"""Is a candidate backend's training the same as the reference's? A verdict per metric, against the noise
that reseeding alone causes.

The unit of evidence is the run (one seed), not the step: the steps of one run share its seed's fate (its
LoRA initialisation, its prompts' order, its early samples), so they are not independent evidence. Each run is
summarised per metric by a summary fixed in advance (SUMMARIES: the mean over all steps; for KL, which grows,
the log of its mean over the last third; for grad_norm the log of its mean). The runs of both backends are taken
in pairs, by shared seed (seed effects cancel) or, without shared seeds, in seed order (independent runs: the
test still holds exactly, whatever each backend's spread), and each pair's difference is one observation of a
paired t-test.

- Looks are planned in advance (LOOKS: 3, 5, 8 and 12 pairs of runs) and alpha is spent over them in proportion
  to the runs (Lan and DeMets' spending alpha x n / 12), with boundaries for the t statistic at each look and for
  each share of alpha a test holds (sequential.boundaries, simulated once). A report read between two looks shows
  the last look's verdict, from its runs: reading at every number of runs spends no more than the plan.
- equivalent: two one-sided tests reject |d| >= margin at the look's boundary; the margin is the metric's own
  (margins: a ratio for KL and grad_norm, an absolute value, or seed SDs of the reference's runs alone, then its
  lower confidence bound, with half of alpha, so that an estimated margin keeps the rate too);
- divergent: otherwise, if the test of d = 0 crosses its boundary after Holm's correction over the family judged
  together: every metric and reward function of one candidate, against the reference and against the reference
  of its trainer stack (a graphical procedure: a rejected test's share of alpha passes to the others, each at its
  look's boundary for its share). A user switches to one backend at a time, so the error that matters is a
  candidate's, as in a trial of several arms against one control (Howard et al., Stat Methods Med Res 2018); a
  report of C candidates that are all alike calls one of them divergent with up to C x alpha, and says so. Every
  test holds an equal share: a difference in any metric is named as readily (benchmarks/alpha_sharing.py measured
  the shares at a real study's spreads: docs/verdicts.md);
- inconclusive: neither; also with fewer than 2 runs of either backend, or before the first look;
- not logged: a run lacks the metric (never 0).

A NaN, a missing step or runs of different lengths are errors (StatsError), never a verdict.
"""

import math
import statistics

from . import effects
from .margins import DEFAULT_MARGINS, LOG_SCALE, MARGIN, equivalence_alpha, margin_bound, margin_spec, margin_words
from .runs import METRIC_KEYS, aligned, label, series
from .sequential import ALPHA, LOOKS, boundaries, holm, look, nominal, sd_shrink, t_quantile, two_sided_p
from .stats import StatsError

# verdict.MARGIN, verdict.margin_spec ...: the margins, where the verdict's callers look for them
__all__ = ["DEFAULT_MARGINS", "LOG_SCALE", "MARGIN", "margin_spec", "margin_words"]

METRICS = tuple(METRIC_KEYS)  # the metrics judged, in the report's column order
EQUIVALENT, DIVERGENT, INCONCLUSIVE, NOT_LOGGED = "equivalent", "divergent", "inconclusive", "not logged"
PAIRED, IN_ORDER = "paired by seed", "independent runs paired in seed order"
POWER_LEVEL = 0.8
# The cells a study is asked to decide (kl, reward, completion length of each candidate against the reference): the
# answer states them first. They hold no more of the family's alpha than any other test (finalize).
HEADLINE = ("kl", "reward", "completion_length")


def _log_mean(values: list[float]) -> float:
    return math.log(max(statistics.fmean(values), 1e-12))


def _last_third(values: list[float]) -> list[float]:
    return values[len(values) - max(1, len(values) // 3):]


# How a run is summarised per metric, fixed before any run is seen: (what the report says, the function).
SUMMARIES = {
    "loss": ("mean over steps", statistics.fmean),
    "reward": ("mean over steps", statistics.fmean),
    "kl": ("log of the mean over the last third of steps", lambda v: _log_mean(_last_third(v))),
    "grad_norm": ("log of the mean over steps", _log_mean),
    "completion_length": ("mean over steps", statistics.fmean),
    "entropy": ("mean over steps", statistics.fmean),
}


def summary(metric: str, values: list[float]) -> float:
    return SUMMARIES.get(metric, SUMMARIES["loss"])[1](values)


def _normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _pairs(reference_means: list[float], candidate_means: list[float], reference_seeds, candidate_seeds):
    """The runs in pairs, in seed order, and the design: by shared seed where at least two seeds are shared;
    otherwise independent runs paired by their place in seed order (their differences are still independent and
    alike, so the paired test holds exactly whatever each backend's spread)."""
    if reference_seeds is not None and candidate_seeds is not None:
        by_seed = dict(zip(reference_seeds, reference_means, strict=True))
        shared = sorted((s, by_seed[s], c) for s, c in zip(candidate_seeds, candidate_means, strict=True)
                        if s in by_seed)
        if len(shared) >= 2:
            return [(r, c) for _, r, c in shared], PAIRED
        reference_means = [v for _, v in sorted(zip(reference_seeds, reference_means, strict=True))]
        candidate_means = [v for _, v in sorted(zip(candidate_seeds, candidate_means, strict=True))]
    return list(zip(reference_means, candidate_means)), IN_ORDER


def judge(reference_means: list[float], candidate_means: list[float], *, alpha: float = ALPHA,
          margin: float | dict = MARGIN, tests: float = 1, reference_seeds: list[int] | None = None,
          candidate_seeds: list[int] | None = None) -> dict:
    """The verdict on one metric from the run summaries of the reference's and the candidate's runs (seeds, where
    given, pair them); `margin`: a margin_spec, or a number of seed-to-seed SDs; `tests`: the number of metrics
    judged together (Holm over them: use finalize for a larger family)."""
    k, m = len(reference_means), len(candidate_means)
    if m < 1:
        raise ValueError("no candidate run to judge")
    spec = margin if isinstance(margin, dict) else {"sd": margin}
    pairs, design = _pairs(reference_means, candidate_means, reference_seeds, candidate_seeds)
    planned = look(len(pairs), alpha)
    used = pairs[:planned["look_runs"]] if planned["look"] else pairs
    difference = statistics.fmean(c - r for r, c in used) if used else 0.0
    evidence = {"reference_runs": k, "candidate_runs": m, "paired_seeds": len(pairs) if design == PAIRED else 0,
                "design": design, "runs_judged": len(used), "difference": difference, "level": alpha,
                "margin_spec": spec, **planned}
    if k < 2 or len(pairs) < 2:
        return {**evidence, "verdict": INCONCLUSIVE, "p_value": 1.0, "equivalent": False,
                "reason": f"{min(k, len(pairs))} run(s) to compare: the noise floor needs at least 2 seeds of each "
                          f"backend (set replicates)"}
    index = planned["look"] - 1 if planned["look"] else None
    bound = margin_bound(spec, [r for r, _ in used], index, alpha)
    differences = [c - r for r, c in used]
    spread = statistics.stdev(differences)
    # the candidate's runs' spread over the reference's: the stated rates assume runs distributed alike up to a shift
    sds = [statistics.stdev(side) for side in zip(*used, strict=True)]
    evidence.update(margin=bound, difference_sd=spread, spread_ratio=sds[1] / sds[0] if sds[0] > 0 else None)
    if planned["look"] == 0:
        return {**evidence, "verdict": INCONCLUSIVE, "p_value": 1.0, "equivalent": False,
                "reason": f"before the first planned look ({LOOKS[0]} runs of each backend)",
                **_next_power(evidence, spread, bound, alpha)}
    n = len(used)
    se = spread / math.sqrt(n)
    # The repeated confidence interval at this look (Jennison and Turnbull): the two-sided boundary of the whole
    # alpha over the looks, so that the intervals of every look a user reads cover the true difference together
    reach = boundaries(alpha)[index] * se
    evidence.update(interval=[difference - reach, difference + reach], interval_level=1 - alpha)
    if se == 0:
        p, equivalent = (1.0 if difference == 0 else 0.0), abs(difference) < bound or difference == 0
    else:
        p = two_sided_p(difference / se, n - 1)
        # two one-sided tests at the margin, each at its alpha over the looks
        equivalent = abs(difference) + boundaries(equivalence_alpha(spec, alpha), sides=1)[index] * se < bound
    evidence.update(p_value=p, equivalent=bool(equivalent), threshold=nominal(alpha / tests, index))
    divergent = p <= evidence["threshold"]
    return {**evidence, **_decide(evidence, divergent), **_next_power(evidence, spread, bound, alpha)}


def _where(evidence: dict) -> str:
    judged, nxt = evidence["runs_judged"], evidence["next_runs"]
    unused = judged < evidence["candidate_runs"] and judged < evidence["reference_runs"]
    return (f"{evidence['design']}, look {evidence['look']} of {evidence['looks']} at {evidence['look_runs']} runs"
            + (f", the runs beyond them wait for the look at {nxt}" if unused and nxt
               else ", runs beyond the last look unused" if unused else ""))


def _decide(evidence: dict, divergent: bool, reason: str | None = None) -> dict:
    """The verdict from a test's divergence and equivalence results."""
    if divergent:
        return {"verdict": DIVERGENT,
                "reason": reason or f"p = {evidence['p_value']:.2g} <= {evidence['threshold']:.3g} "
                                    f"({_where(evidence)})"}
    if evidence["equivalent"]:
        return {"verdict": EQUIVALENT, "reason": f"within the margin ({_where(evidence)})"}
    nxt = evidence.get("next_runs")
    return {"verdict": INCONCLUSIVE,
            "reason": f"neither shown ({_where(evidence)})" + (f"; next look at {nxt} runs of each backend" if nxt else
                                                             "; the last planned look: " + _beyond_plan(evidence))}


BEYOND = 200  # the most runs of each backend _beyond_plan considers


def _beyond_plan(evidence: dict) -> str:
    """What an open verdict at the last planned look would need: about how many runs of each backend a new study,
    planned with the same alpha at its last look, would need at the measured difference and spread to show it
    divergent, and, where the difference is within the margin, equivalent (estimates from these runs, not
    verdicts)."""
    d, bound, spread = abs(evidence["difference"]), evidence.get("margin"), evidence.get("difference_sd")
    alpha = evidence["threshold"]  # the p this test had to reach at the last look
    if not bound or not spread:
        return "no spread to plan from"
    se = lambda n: spread / math.sqrt(n)  # noqa: E731
    needs = {"divergent": next((n for n in range(3, BEYOND + 1) if two_sided_p(d / se(n), n - 1) <= alpha), None)}
    if d < bound:
        needs["equivalent"] = next((n for n in range(3, BEYOND + 1) if d + t_quantile(1 - alpha, n - 1) * se(n) < bound),
                                   None)
    where = ("as large as" if d >= bound else "within") + f" the margin ({bound:.3g})"
    options = sorted(needs.items(), key=lambda item: item[1] or BEYOND + 1)
    said = " or ".join(f"{verdict} at {f'about {n}' if n else f'more than {BEYOND}'} runs of each"
                       for verdict, n in options)
    return (f"the difference ({d:.3g}) is {where}" + ("" if d < bound else ", so equivalence cannot be shown") +
            f"; beyond the plan, at the spread measured, it would be {said} (an estimate, not a verdict)")


def _next_power(evidence: dict, spread: float, bound: float, alpha: float) -> dict:
    """At the next planned look: the chance to confirm equivalence if the backends were alike, and to call the
    difference divergent if it were as measured (normal approximations with the spread as measured)."""
    n = evidence.get("next_runs")
    if n is None:
        return {}
    index = LOOKS.index(n)
    se = spread / math.sqrt(n)
    if se == 0:
        return {"next_power_equivalent": 1.0, "next_power_divergent": 1.0 if evidence["difference"] else 0.0}
    spec = evidence["margin_spec"]
    if "sd" in spec:  # the margin at the next look, its SD estimate as now
        now = sd_shrink(evidence["look"] - 1, alpha / 2) if evidence["look"] else 1.0
        bound = bound / now * sd_shrink(index, alpha / 2)
    z = boundaries(equivalence_alpha(spec, alpha), sides=1)[index]
    return {"next_power_equivalent": max(0.0, 2 * _normal_cdf(bound / se - z) - 1),
            "next_power_divergent": _normal_cdf(abs(evidence["difference"]) / se - boundaries(alpha)[index])}


def judge_runs(reference_runs: list[dict], candidate_runs: list[dict], metric: str, *, alpha: float = ALPHA,
               margin: float = MARGIN, margins: dict | None = None, tests: int = 1) -> dict:
    """The verdict on `metric` from whole runs (all of one step count): their per-step series, checked, each
    summarised as SUMMARIES says, paired by seed, within the metric's margin (margin_spec)."""
    lengths = {len(run["steps"]) for run in [*reference_runs, *candidate_runs]}
    if len(lengths) > 1:
        counts = ", ".join(f"{label(r)} has {len(r['steps'])}" for r in [*reference_runs, *candidate_runs])
        raise StatsError(f"runs of different length cannot be compared step by step: {counts}; rerun the shorter")
    missing = [label(r) for r in [*reference_runs, *candidate_runs] if series(r, metric) is None]
    if missing:
        return {"verdict": NOT_LOGGED, "not_logged_in": missing, "reason": f"not logged in {', '.join(missing)}"}
    means = [[summary(metric, series(r, metric)) for r in runs] for runs in (reference_runs, candidate_runs)]
    spec = margin_spec(metric, margins, margin)
    result = judge(*means, alpha=alpha, margin=spec, tests=tests, reference_seeds=[r["seed"] for r in reference_runs],
                   candidate_seeds=[r["seed"] for r in candidate_runs])
    return {**result, "margin_words": margin_words(metric, spec), "effect": effects.effect(metric, result),
            "summary": SUMMARIES[metric][0] if metric in SUMMARIES else SUMMARIES["loss"][0]}


def finalize(verdicts: list[dict], headline: list[bool] | None = None) -> list[dict]:
    """The verdicts judged together (every metric of one comparison, or of all a candidate's comparisons):
    divergence by Holm over the whole family at the study's alpha, every test holding an equal share, each at its
    look's boundary for that share; equivalence as each test found it. `headline` marks the tests of the HEADLINE
    metrics (recorded, not weighted). Changes them in place."""
    marks = headline if headline is not None else [False] * len(verdicts)
    judged = [(v, h) for v, h in zip(verdicts, marks, strict=True)
              if v["verdict"] != NOT_LOGGED and "look" in v and v["look"] > 0 and "equivalent" in v]
    if not judged:
        return verdicts
    family_alpha = min(v["level"] for v, _ in judged)
    size = len(judged)
    rejected = holm([v["p_value"] for v, _ in judged], family_alpha,
                    threshold=lambda i, level: nominal(level, judged[i][0]["look"] - 1))
    for (v, h), divergent in zip(judged, rejected, strict=True):
        v["threshold"] = nominal(family_alpha / size, v["look"] - 1)  # Holm's first step for it
        v.update(_decide(v, divergent, f"p = {v['p_value']:.2g}, Holm over {size} tests at {family_alpha:.3g} "
                                       f"({_where(v)})"), family_size=size, headline=bool(h))
    return verdicts


def noise_floor(reference_runs: list[dict], metric: str) -> dict | None:
    """Per step, how far the reference's runs of different seeds are apart: their mean, lowest and highest
    value, and the mean distance between two of them. None where not logged or fewer than two runs."""
    curves = [series(r, metric) for r in reference_runs]
    if len(curves) < 2 or any(c is None for c in curves):
        return None
    curves = aligned(reference_runs, metric)
    per_step = list(zip(*curves, strict=True))
    pairs = [(i, j) for i in range(len(curves)) for j in range(i + 1, len(curves))]
    return {
        "runs": len(curves),
        "mean": [statistics.fmean(v) for v in per_step],
        "low": [min(v) for v in per_step],
        "high": [max(v) for v in per_step],
        "pairwise_abs_diff": [statistics.fmean(abs(v[i] - v[j]) for i, j in pairs) for v in per_step],
    }
