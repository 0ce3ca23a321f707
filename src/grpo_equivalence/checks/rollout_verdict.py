"""Verdicts of the rollout check (grpo_equivalence.checks.rollout): a candidate's sampled and scored completions against
the reference's, from the same checkpoint and prompts.

Where a backend reported the logits its sampler drew from (grpo_equivalence.checks.exact), its sampler is judged on
them alone (own_support_test, own_score_test: one-sample, against the settings applied to those very logits, at
any temperature and precision), the reference's sampler too (own_check), and its numerics against the
reference's (numerics_test). For a backend that cannot report them, the two tests below compare its tokens,
scored with the trainer's logits, with the reference's. Five tests, each with a divergence p-value (but the paired
ones) and an equivalence test against a margin fixed in advance:

- numerics: the mean |sampler - trainer| raw log-probability of a drawn token (exact.numerics_sums), the
  candidate's against `numerics_bound` (NUMERICS_BOUND, set from the float8 rollout fault and the compiled engines),
  by prompts (the tokens of a prompt's completions are not independent). One-sided: divergent when beyond, equivalent
  when within, at alpha; its ratio to the reference's mismatch is a property, shown, not judged.

- support: tokens the study's settings exclude clearly, beyond the rounding band (grpo_equivalence.checks.scoring),
  per token sampled. The candidate's count against the reference's, conditionally on their sum (binomial,
  one-sided: a correct sampler draws none, so only more is a fault). Equivalent when the candidate's rate is, at
  1 - alpha confidence (Clopper-Pearson, exact at the alternative's binomial variance), within `support_margin`
  of the reference's.
- score: the mean of log q(x) + H(q) over the positions the rounding does not decide, whose variance under
  correct sampling is known exactly at every token; the candidate's mean against the reference's (z-test).
  Equivalence is two-sided: the margins are the shifts samplers hotter and colder by `temperature_margin` (a
  relative temperature, so that it means the same at temperature 0.1 as at 1.0) would cause at the very
  positions scored, and each one-sided test uses the variance the candidate would have at that margin (TOST at
  the alternative's variance, not the null's, which is larger at the hot margin). A check with no such position
  (every choice left to the rounding) has "no variation" on this test.
- completion_length and reward: per prompt, the candidate's mean over its completions minus the reference's
  (the prompts are shared: paired). Equivalence tests only (two one-sided tests within `margin` standard
  deviations of a completion's value): they are consequences of the tokens drawn, which the two tests above
  judge exactly, and their values are discrete and heavy-tailed; the paired t-test's p is shown as evidence.
  Where every completion of both backends has the same value (a model with random weights: every completion
  runs to the length limit and earns the same reward), the test has no variation to judge: "no variation",
  left out of the candidate's verdict, never "equivalent".

Divergence is decided on the support and score tests, with Holm's step-down over those of every candidate
judged together (the report's family), so that a report of candidates that all sample correctly calls
something divergent at most alpha of the time. A candidate is divergent if one of them is, equivalent if all
four tests are (those with no variation left out; never without the score test, which is what sees a sampler's
temperature), inconclusive otherwise: then the evidence says how many completions would confirm equivalence
90 % of the time if the two sampled alike.
The sampler/trainer mismatch (where the backend reports its own log-probabilities) is shown, not judged:
it has no noise floor to judge it against.
"""

import math
import statistics

from ..analysis.sequential import holm
from ..analysis.stats import StatsError
from ..analysis.verdict import DIVERGENT, EQUIVALENT, INCONCLUSIVE
from .own_verdict import NUMERICS_BOUND, _factor, _z, numerics_test, own_check, own_score_test, \
    own_support_test, own_totals
from .power import PAIRED_FIELDS

__all__ = ["own_check", "compare", "finalize", "TESTS", "DIVERGENCE_TESTS", "NO_VARIATION", "NOT_REPORTED"]

TESTS = ("support", "score", "numerics", "completion_length", "reward")
NO_VARIATION = "no variation"  # a paired test where every completion of both backends had the same value
NOT_REPORTED = "not reported"  # numerics where a side reported no logits of its sampler
DIVERGENCE_TESTS = ("support", "score", "numerics")  # the others are equivalence tests only



def totals(run: dict) -> dict:
    """A rollout-check file in the sums the tests need, and per prompt the mean length and reward."""
    completions = run["completions"]
    per_prompt: dict[int, list] = {}
    for c in completions:
        per_prompt.setdefault(c["prompt"], []).append(c)
    return {
        "tokens": sum(c["tokens"] for c in completions),
        "outside": sum(c["outside_clear"] for c in completions),
        "outside_strict": sum(c["outside"] for c in completions),
        "scored": sum(c["scored"] for c in completions),
        "score": sum(c["score"] for c in completions),
        "variance": sum(c["variance"] for c in completions),
        **{key: sum(c[key] for c in completions) for key in ("decided", "hot_shift", "hot_variance", "cold_shift",
                                                              "cold_variance")},
        "completions": len(completions),
        # a reward of NaN: no reward function scored the completion (TRL's "unscorable"), left out as training does
        "unscorable": sum(not math.isfinite(c["reward"]) for c in completions),
        "values": {key: [v for c in completions if math.isfinite(v := c[field])]
                   for key, field in PAIRED_FIELDS.items()},
        "by_prompt": {key: {p: statistics.fmean(values) for p, cs in per_prompt.items()
                            if (values := [v for c in cs if math.isfinite(v := c[field])])}
                      for key, field in PAIRED_FIELDS.items()},
    }




def support_test(ref: dict, cand: dict, *, alpha: float, margin: float) -> dict:
    from scipy.stats import beta, binom

    k_c, n_c, k_r, n_r = cand["outside"], cand["tokens"], ref["outside"], ref["tokens"]
    if n_c == 0 or n_r == 0:
        raise StatsError("a rollout check without sampled tokens cannot be judged; sample more (rollout_check.prompts)")
    p = float(binom.sf(k_c - 1, k_c + k_r, n_c / (n_c + n_r))) if k_c + k_r else 1.0
    upper = 1.0 if k_c >= n_c else float(beta.ppf(1 - alpha, k_c + 1, n_c - k_c))
    excess = upper - k_r / n_r
    result = {"p_value": p, "equivalent": excess < margin, "candidate_rate": k_c / n_c, "reference_rate": k_r / n_r,
              "candidate_outside": k_c, "reference_outside": k_r, "upper_excess": excess, "margin": margin}
    if not result["equivalent"]:
        # tokens such that, with as few outside as the reference has, the upper bound falls under the margin
        result["needed_factor"] = max(1.0, -math.log(alpha) / max(margin - k_r / n_r, 1e-12) / n_c)
    return result


def score_test(ref: dict, cand: dict, *, alpha: float) -> dict:
    from scipy.stats import norm

    if cand["scored"] == 0 or ref["scored"] == 0 or ref["variance"] + cand["variance"] == 0:
        # no decided position where the settings leave a choice: nothing the rounding does not decide
        # nothing measured: the figures are None (the report prints "not logged"), never 0
        return {"p_value": 1.0, "difference": None, "se": None, "z": None, "margin": None, "margins": [None, None],
                "equivalent": False, "no_variation": True, "reference_z": None, "candidate_z": None,
                "reason": "no position where the settings leave a choice and the rounding does not decide it"}
    means = [run["score"] / run["scored"] for run in (ref, cand)]
    se = math.sqrt(ref["variance"] / ref["scored"] ** 2 + cand["variance"] / cand["scored"] ** 2)
    difference = means[1] - means[0]
    pooled = ref["scored"] + cand["scored"]
    # the margins: what a sampler hotter (below 0) or colder (above) by temperature_margin would shift the mean by
    hot, cold = (ref["hot_shift"] + cand["hot_shift"]) / pooled, (ref["cold_shift"] + cand["cold_shift"]) / pooled
    # TOST, each side at the variance the candidate would have if it sampled at that margin
    crit = _z(1 - alpha)
    se_hot = math.sqrt(ref["variance"] / ref["scored"] ** 2 + cand["hot_variance"] / cand["scored"] ** 2)
    se_cold = math.sqrt(ref["variance"] / ref["scored"] ** 2 + cand["cold_variance"] / cand["scored"] ** 2)
    z = difference / se if se > 0 else (0.0 if difference == 0 else math.copysign(math.inf, difference))
    result = {"p_value": float(2 * norm.sf(abs(z))), "difference": difference, "se": se, "z": z,
              "margin": min(-hot, cold), "margins": [hot, cold],
              "equivalent": hot < 0 < cold and difference - crit * se_hot > hot and difference + crit * se_cold < cold,
              # each backend on its own against the settings: N(0, 1) under correct sampling
              "reference_z": ref["score"] / math.sqrt(ref["variance"]) if ref["variance"] else 0.0,
              "candidate_z": cand["score"] / math.sqrt(cand["variance"]) if cand["variance"] else 0.0}
    if not result["equivalent"]:
        result["needed_factor"] = _factor(max(se_hot, se_cold), min(-hot, cold), alpha)
    return result


def paired_test(ref: dict, cand: dict, key: str, *, alpha: float, margin_sd: float) -> dict:
    from scipy.stats import t as student

    shared = sorted(set(ref["by_prompt"][key]) & set(cand["by_prompt"][key]))
    if not ref["values"][key] or not cand["values"][key]:  # every reward function returned None for every completion
        return {"p_value": 1.0, "difference": 0.0, "se": 0.0, "prompts": 0, "margin": 0.0, "equivalent": False,
                "no_variation": True, "reference_mean": None, "candidate_mean": None,
                "reason": f"no completion of {'the reference' if not ref['values'][key] else 'this backend'} had a "
                          f"{key} (every reward function returned None)"}
    if len(shared) < 2:
        raise StatsError("the rollout checks share fewer than two prompts; give both the same rollout_check settings")
    differences = [cand["by_prompt"][key][p] - ref["by_prompt"][key][p] for p in shared]
    n, mean = len(differences), statistics.fmean(differences)
    sd = statistics.stdev(differences)
    if statistics.pstdev(ref["values"][key] + cand["values"][key]) == 0:  # nothing to tell the samplers apart by
        value = ref["values"][key][0]
        return {"p_value": 1.0, "difference": 0.0, "se": 0.0, "prompts": n, "margin": 0.0, "equivalent": False,
                "no_variation": True, "reference_mean": value, "candidate_mean": value,
                "reason": f"every completion of both had {key} {value:g}"}
    # the margin from the reference's completions alone, fixed before the candidate is read (a noisier candidate does
    # not widen it); estimated from hundreds of completions, its own error is small beside the test's
    margin = margin_sd * (statistics.stdev(ref["values"][key]) if len(ref["values"][key]) > 1 else 0.0)
    se = sd / math.sqrt(n)
    t = mean / se if se > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    result = {"p_value": float(2 * student.sf(abs(t), n - 1)), "difference": mean, "se": se, "prompts": n,
              "margin": margin, "equivalent": abs(mean) + float(student.ppf(1 - alpha, n - 1)) * se < margin,
              "reference_mean": statistics.fmean(ref["values"][key]),
              "candidate_mean": statistics.fmean(cand["values"][key])}
    if not result["equivalent"]:
        result["needed_factor"] = _factor(se, margin, alpha)
    return result


def compare(reference: dict, candidate: dict, *, alpha: float, support_margin: float, margin_sd: float,
            numerics_bound: float | None = None) -> dict:
    """The tests of one candidate's rollout-check file against the reference's, before the family's correction: its
    sampler on its own logits where it reported them (else against the reference's, both scored by the trainer),
    its numerics against the reference's, and the paired tests."""
    if reference.get("order", "transformers") != candidate.get("order", "transformers"):
        raise StatsError(f"the rollout checks of {reference['backend']} and {candidate['backend']} scored with different "
                         f"filter orders; rerun both with one rollout_check.order")
    for run in (reference, candidate):
        if run["sampling"] != reference["sampling"]:
            raise StatsError(f"the rollout checks of {reference['backend']} and {candidate['backend']} used different "
                             f"sampling settings ({reference['sampling']} vs {candidate['sampling']}); rerun both")
    ref, cand = totals(reference), totals(candidate)
    if candidate.get("sampler_logits"):
        own = own_totals(candidate)
        sampler = {"support": own_support_test(own, alpha=alpha, margin=support_margin),
                   "score": own_score_test(own, alpha=alpha)}
    else:
        sampler = {"support": support_test(ref, cand, alpha=alpha, margin=support_margin),
                   "score": score_test(ref, cand, alpha=alpha)}
    tests = {
        **sampler,
        "numerics": numerics_test(reference, candidate, alpha=alpha,
                                  bound=NUMERICS_BOUND if numerics_bound is None else numerics_bound),
        **{key: paired_test(ref, cand, key, alpha=alpha, margin_sd=margin_sd) for key in ("completion_length", "reward")},
    }
    return {"reference": reference["backend"], "candidate": candidate["backend"], "reference_seed": reference["seed"],
            "candidate_seed": candidate["seed"], "alpha": alpha, "tokens": {"reference": ref["tokens"],
            "candidate": cand["tokens"]}, "completions": {"reference": ref["completions"], "candidate": cand["completions"]},
            "mismatch": {"reference": reference.get("mismatch"), "candidate": candidate.get("mismatch")},
            "numerics": {"reference": reference.get("numerics"), "candidate": candidate.get("numerics")},
            "fault": candidate.get("fault"), "tests": tests}


def finalize(comparisons: list[dict], alpha: float) -> list[dict]:
    """Verdicts for comparisons judged together: Holm over all their tests, then per test and per candidate. A
    numerics test a side reported nothing for is left out ("not reported"), as a test with no variation is."""
    flat = [(c, name) for c in comparisons for name in DIVERGENCE_TESTS
            if name in c["tests"] and not c["tests"][name].get("not_reported")]
    rejected = holm([c["tests"][name]["p_value"] for c, name in flat], alpha)
    for (comparison, name), divergent in zip(flat, rejected, strict=True):
        test = comparison["tests"][name]
        test["verdict"] = DIVERGENT if divergent else EQUIVALENT if test["equivalent"] else INCONCLUSIVE
    for comparison, name in flat:  # a divergence test with nothing to judge and nothing found: left out
        test = comparison["tests"][name]
        if test.get("no_variation") and test["verdict"] != DIVERGENT:
            test["verdict"] = NO_VARIATION
    for comparison in comparisons:
        for name, test in comparison["tests"].items():
            if test.get("not_reported"):
                test["verdict"] = NOT_REPORTED
            elif name not in DIVERGENCE_TESTS:
                test["verdict"] = (NO_VARIATION if test.get("no_variation") else EQUIVALENT if test["equivalent"]
                                   else INCONCLUSIVE)
    for comparison in comparisons:
        verdicts = [test["verdict"] for test in comparison["tests"].values()
                    if test["verdict"] not in (NO_VARIATION, NOT_REPORTED)]
        comparison["family_size"] = len(flat)
        comparison["verdict"] = (DIVERGENT if DIVERGENT in verdicts else EQUIVALENT if set(verdicts) == {EQUIVALENT}
                                 else INCONCLUSIVE)
        if comparison["verdict"] == EQUIVALENT and comparison["tests"]["score"]["verdict"] == NO_VARIATION:
            # the score is what sees a sampler's temperature: without it, equivalence is not shown, only unrefuted
            comparison["verdict"] = INCONCLUSIVE
            comparison["reason"] = "the score test has no position the rounding does not decide"
        open_tests = [t for t in comparison["tests"].values() if t["verdict"] == INCONCLUSIVE]
        factor = max((t.get("needed_factor", 1.0) for t in open_tests), default=None)
        comparison["needed_completions"] = (math.ceil(factor * comparison["completions"]["candidate"])
                                            if factor is not None and math.isfinite(factor) else None)
    return comparisons
