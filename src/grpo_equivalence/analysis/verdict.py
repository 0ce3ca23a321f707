"""Is a candidate backend's training the same as the reference's? A verdict per metric, against the noise
that reseeding alone causes.

The unit of evidence is the run (one seed), not the step: the steps of one run share its seed's fate (its
LoRA initialisation, its prompts' order, its early samples), so they are not independent evidence. Each run is
summarised per metric by a summary fixed in advance (SUMMARIES: the mean over all steps; for KL, which grows,
the log of its mean over the last third; for grad_norm the log of its mean), and the runs of different seeds
give the seed-to-seed standard deviation s of that summary (pooled over both backends). The margin is
`margin` x sqrt(2) x s: what two seeds of one backend differ by.

- Runs that share seeds (the same prompts' order and LoRA initialisation for both backends) are compared in
  pairs: the difference per shared seed, a paired t-test; seed effects cancel, so the same margin is reached
  with fewer runs. Without shared seeds, the two backends' means are compared (Wellek's exact equivalence
  test, its bound from the non-central F distribution, finite everywhere).
- Looks are planned in advance (LOOKS: 3, 5, 8 and 12 runs per backend) and alpha is spent over them in
  proportion to the runs (Lan and DeMets' spending function alpha x n / 12), so that adding runs until a verdict
  appears keeps both error rates at alpha. A look's own alpha (look_alphas) is the nominal level of the group
  sequential boundary that spends that much: the looks share their runs, so a later look gets more than its
  increment (3 runs: alpha / 4, as an equal split gives; 12 runs: 0.027 at alpha 0.05, against 0.0125). The
  verdict at n runs uses the alpha of the last planned look at or below n, and says when the next look is and
  its power.
- equivalent: the equivalence test rejects |d| >= margin at the look's alpha;
- divergent: otherwise, if the test of d = 0 rejects at the look's alpha after Holm's correction over the
  family judged together: every metric and reward function of one comparison (a candidate against the
  reference, or against the reference of its trainer stack). A user switches to one backend at a time, so the
  error that matters is a comparison's, as in a trial of several arms against one control, where each arm is
  its own question (Howard et al., Stat Methods Med Res 2018); the calibration measures exactly that, and a
  report of five candidates that are all equivalent calls one of them divergent with up to five times it.
  The correction is weighted: the headline tests (HEADLINE metrics, the question a study asks) share
  HEADLINE_SHARE of alpha, every other test of the family the rest, so that the family-wise error stays at
  alpha while many metrics and reward functions do not dilute the headline;
- inconclusive: neither; also with fewer than 2 runs of the reference and fewer than 2 shared seeds;
- not logged: a run lacks the metric (never 0).

A NaN, a missing step or runs of different lengths are errors (StatsError), never a verdict.
"""

import math
import statistics

from .runs import METRIC_KEYS, label, series
from .sequential import ALPHA, LOOKS, equivalence_bound, holm, look, t_quantile, two_sided_p
from .stats import StatsError

METRICS = tuple(METRIC_KEYS)  # the metrics judged, in the report's column order
EQUIVALENT, DIVERGENT, INCONCLUSIVE, NOT_LOGGED = "equivalent", "divergent", "inconclusive", "not logged"
MARGIN = 1.0  # in standard deviations of a seed-to-seed difference
POWER_LEVEL = 0.8
# The cells a study is asked to decide (kl, reward, completion length of each candidate against the reference), and
# the share of the family's alpha their tests carry in Holm's weighted correction; fixed before any run is seen.
HEADLINE = ("kl", "reward", "completion_length")
HEADLINE_SHARE = 0.8


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


def _pooled_sd(reference: list[float], candidate: list[float]) -> float:
    k, m = len(reference), len(candidate)
    ss = sum((k_ - 1) * statistics.variance(v) for k_, v in ((k, reference), (m, candidate)) if k_ > 1)
    return math.sqrt(ss / (k + m - 2))


def _normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def judge(reference_means: list[float], candidate_means: list[float], *, alpha: float = ALPHA,
          margin: float = MARGIN, tests: float = 1, reference_seeds: list[int] | None = None,
          candidate_seeds: list[int] | None = None) -> dict:
    """The verdict on one metric from the run summaries of the reference's and the candidate's runs (seeds, where
    given, pair them); `tests` is the number of metrics judged together (Holm over them: use finalize for a
    larger family)."""
    k, m = len(reference_means), len(candidate_means)
    if m < 1:
        raise ValueError("no candidate run to judge")
    pairs = []
    if reference_seeds is not None and candidate_seeds is not None:
        by_seed = dict(zip(reference_seeds, reference_means, strict=True))
        pairs = [(by_seed[s], c) for s, c in zip(candidate_seeds, candidate_means, strict=True) if s in by_seed]
    paired = len(pairs) >= 2
    runs = len(pairs) if paired else min(k, m)
    planned = look(runs, alpha)
    difference = (statistics.fmean(c - r for r, c in pairs) if paired
                  else statistics.fmean(candidate_means) - statistics.fmean(reference_means))
    evidence = {"reference_runs": k, "candidate_runs": m, "paired_seeds": len(pairs) if paired else 0,
                "design": "paired by seed" if paired else "unpaired", "difference": difference, **planned}
    if k < 2:
        return {**evidence, "verdict": INCONCLUSIVE, "p_value": 1.0, "equivalent": False,
                "reason": f"{k} reference run(s): the noise floor needs at least 2 seeds of the reference "
                          f"(set replicates.reference)"}
    s = _pooled_sd(reference_means, candidate_means)
    bound = margin * math.sqrt(2) * s
    evidence.update(pooled_sd=s, margin=bound)
    if planned["look"] == 0:
        return {**evidence, "verdict": INCONCLUSIVE, "p_value": 1.0, "equivalent": False,
                "reason": f"before the first planned look ({LOOKS[0]} runs of each backend)",
                **_next_power(evidence, pairs, s, bound, alpha)}
    look_alpha = planned["alpha"]
    if paired:
        differences = [c - r for r, c in pairs]
        sd = statistics.stdev(differences)
        se, df = sd / math.sqrt(runs), runs - 1
        evidence.update(difference_sd=sd)
        if se == 0:
            p, equivalent = (1.0 if difference == 0 else 0.0), difference == 0 or abs(difference) < bound
        else:
            p = two_sided_p(difference / se, df)
            equivalent = abs(difference) + t_quantile(1 - look_alpha, df) * se < bound
    else:
        df, scale = k + m - 2, math.sqrt(1 / k + 1 / m)
        if s == 0:
            p, equivalent = (1.0 if difference == 0 else 0.0), difference == 0
        else:
            t_value = difference / (s * scale)
            p = two_sided_p(t_value, df)
            equivalent = abs(t_value) < equivalence_bound(df, margin * math.sqrt(2) / scale, look_alpha)
    evidence.update(p_value=p, equivalent=bool(equivalent))
    divergent = p <= look_alpha / tests
    return {**evidence, **_decide(evidence, divergent, look_alpha, tests),
            **_next_power(evidence, pairs if paired else [], s, bound, alpha)}


def _decide(evidence: dict, divergent: bool, look_alpha: float, tests: float) -> dict:
    """The verdict from a test's p-value and equivalence result, at the look's alpha over `tests` hypotheses."""
    where = f"look {evidence['look']} of {evidence['looks']}, alpha {look_alpha:.3g}"
    if divergent:
        return {"verdict": DIVERGENT,
                "reason": f"p = {evidence['p_value']:.2g} <= {look_alpha:.3g}" + (f"/{tests:.3g}" if tests > 1 else "")
                + f" ({evidence['design']}, {where})"}
    if evidence["equivalent"]:
        return {"verdict": EQUIVALENT, "reason": f"within the margin ({evidence['design']}, {where})"}
    nxt = evidence.get("next_runs")
    return {"verdict": INCONCLUSIVE,
            "reason": f"neither shown ({where})" + (f"; next look at {nxt} runs of each backend" if nxt else
                                                   "; the last planned look: " + _beyond_plan(evidence, look_alpha,
                                                                                              tests))}


BEYOND = 200  # the most runs of each backend _beyond_plan considers


def _beyond_plan(evidence: dict, alpha: float, tests: float) -> str:
    """What an open verdict at the last planned look would need: about how many runs of each backend a new study,
    planned with the same alpha at its last look, would need at the measured difference and spread to show it
    divergent, and, where the difference is within the margin, equivalent (estimates from these runs, not
    verdicts)."""
    d, bound = abs(evidence["difference"]), evidence.get("margin")
    # The spread of one seed's difference: measured where paired, from the pooled SD of a run otherwise
    spread = evidence.get("difference_sd") or math.sqrt(2) * evidence.get("pooled_sd", 0.0)
    if not bound or not spread:
        return "no spread to plan from"
    se = lambda n: spread / math.sqrt(n)  # noqa: E731
    needs = {"divergent": next((n for n in range(3, BEYOND + 1) if two_sided_p(d / se(n), n - 1) <= alpha / tests),
                               None)}
    if d < bound:
        needs["equivalent"] = next((n for n in range(3, BEYOND + 1) if d + t_quantile(1 - alpha, n - 1) * se(n) < bound),
                                   None)
    where = ("as large as" if d >= bound else "within") + f" the margin ({bound:.3g})"
    options = sorted(needs.items(), key=lambda item: item[1] or BEYOND + 1)
    said = " or ".join(f"{verdict} at {f'about {n}' if n else f'more than {BEYOND}'} runs of each"
                       for verdict, n in options)
    return (f"the difference ({d:.3g}) is {where}" + ("" if d < bound else ", so equivalence cannot be shown") +
            f"; beyond the plan, at the spread measured, it would be {said} (an estimate, not a verdict)")


def _next_power(evidence: dict, pairs: list, s: float, bound: float, alpha: float) -> dict:
    """At the next planned look: the chance to confirm equivalence if the backends were alike, and to call the
    difference divergent if it were as measured (normal approximations with the spread as measured)."""
    n = evidence.get("next_runs")
    if n is None:
        return {}
    nxt = look(n, alpha)
    z = -t_quantile(nxt["alpha"], max(n - 1, 1))
    if len(pairs) >= 2:
        spread = statistics.stdev(c - r for r, c in pairs)
        se = spread / math.sqrt(n)
    else:
        se = s * math.sqrt(2 / n)
    if se == 0:
        return {"next_power_equivalent": 1.0, "next_power_divergent": 1.0 if evidence["difference"] else 0.0}
    return {"next_power_equivalent": max(0.0, 2 * _normal_cdf(bound / se - z) - 1),
            "next_power_divergent": _normal_cdf(abs(evidence["difference"]) / se - z)}


def judge_runs(reference_runs: list[dict], candidate_runs: list[dict], metric: str, *, alpha: float = ALPHA,
               margin: float = MARGIN, tests: int = 1) -> dict:
    """The verdict on `metric` from whole runs (all of one step count): their per-step series, checked, each
    summarised as SUMMARIES says, paired by seed."""
    lengths = {len(run["steps"]) for run in [*reference_runs, *candidate_runs]}
    if len(lengths) > 1:
        counts = ", ".join(f"{label(r)} has {len(r['steps'])}" for r in [*reference_runs, *candidate_runs])
        raise StatsError(f"runs of different length cannot be compared step by step: {counts}; rerun the shorter")
    missing = [label(r) for r in [*reference_runs, *candidate_runs] if series(r, metric) is None]
    if missing:
        return {"verdict": NOT_LOGGED, "not_logged_in": missing, "reason": f"not logged in {', '.join(missing)}"}
    means = [[summary(metric, series(r, metric)) for r in runs] for runs in (reference_runs, candidate_runs)]
    result = judge(*means, alpha=alpha, margin=margin, tests=tests, reference_seeds=[r["seed"] for r in reference_runs],
                   candidate_seeds=[r["seed"] for r in candidate_runs])
    return {**result, "summary": SUMMARIES[metric][0] if metric in SUMMARIES else SUMMARIES["loss"][0]}


def headline_weights(headline: list[bool]) -> list[float]:
    """Holm's weights for a family whose headline tests share HEADLINE_SHARE of alpha (equal where all or none are)."""
    count = sum(headline)
    if count in (0, len(headline)):
        return [1.0] * len(headline)
    rest = len(headline) - count
    return [HEADLINE_SHARE / count if h else (1 - HEADLINE_SHARE) / rest for h in headline]


def finalize(verdicts: list[dict], headline: list[bool] | None = None) -> list[dict]:
    """The verdicts judged together (every metric of one comparison): divergence by Holm over the
    whole family at the smallest look alpha among them, weighted so that the tests `headline` marks share
    HEADLINE_SHARE of it; equivalence as each test found it. Changes them in place."""
    marks = headline if headline is not None else [False] * len(verdicts)
    judged = [(v, h) for v, h in zip(verdicts, marks, strict=True)
              if v["verdict"] != NOT_LOGGED and "look" in v and v["look"] > 0 and "equivalent" in v]
    if not judged:
        return verdicts
    family_alpha = min(v["alpha"] for v, _ in judged)
    weights = headline_weights([h for _, h in judged])
    total, size = sum(weights), len(judged)
    headlines = sum(h for _, h in judged)
    share = (f", the {headlines} headline tests sharing {HEADLINE_SHARE:.0%} of it"
             if 0 < headlines < size else "")
    rejected = holm([v["p_value"] for v, _ in judged], family_alpha, weights)
    for (v, h), weight, divergent in zip(judged, weights, rejected, strict=True):
        # as many tests as would give this one its weight's share of alpha in an unweighted family
        v.update(_decide(v, divergent, family_alpha, total / weight), family_size=size, headline=bool(h))
        if divergent:
            v["reason"] = f"p = {v['p_value']:.2g}, Holm over {size} tests at {family_alpha:.3g}{share} ({v['design']})"
    return verdicts


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
