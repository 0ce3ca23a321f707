"""The tests of a sampler judged on the logits it drew from (grpo_equivalence.checks.exact), and of its numerics
against the reference's: rollout_verdict's support, score and numerics tests where a backend reported its logits."""

import math

from ..analysis.stats import StatsError

CONFIRM_POWER = 0.9  # the chance of confirming equivalence, if it holds, that the advice on more samples aims for
# The numerics' bound: a mean |sampler - trainer| log-probability of a drawn token beyond it is a defect, within it a
# property of the backend's kernels (said as a ratio to the reference's mismatch, never as a verdict). Set from the
# GPU's bfloat16 rows (benchmarks/numerics_bound.py): the float8 rollout fault at 0.0117 to 0.0144 (43 checks; 0.016
# to 0.017 in float32 on the CPU), correct compiled engines at most 0.0071 (hf_static 0.0034, native 0.0044 to
# 0.0047, trl_vllm 0.0051 to 0.0071), eager ones at most 0.0012: 0.009, about the geometric midpoint of the largest
# correct and the smallest faulty mismatch (docs/rollout-check.md). Until 2026-12-08 the bound was twice the
# reference's mismatch plus half a bfloat16 step, which called every compiled engine divergent beside an eager
# reference. NeMo-RL's CI gate, 1.05 on token_mult_prob_error, is about 0.05.
NUMERICS_BOUND = 0.009


def _z(p: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(p))


def own_totals(run: dict) -> dict:
    """A check's own-logits sums (the sampler judged on what it drew from), in the names the tests take."""
    completions = run["completions"]
    keys = ("outside", "outside_clear", "scored", "score", "variance", "decided", "unjudged", "hot_shift",
            "hot_variance", "cold_shift", "cold_variance")
    found = {key: sum(c[f"own_{key}"] for c in completions) for key in keys}
    return {**found, "tokens": sum(c["tokens"] for c in completions), "outside_strict": found["outside"],
            "outside": found["outside_clear"]}


def own_support_test(own: dict, *, alpha: float, margin: float) -> dict:
    """Tokens drawn outside the support the settings give the sampler's own logits: a correct sampler draws none,
    so one is divergent (p 0); equivalent when, at 1 - alpha confidence, fewer than `margin` a token would be."""
    k, n = own["outside"], own["tokens"]
    if n == 0:
        raise StatsError("a rollout check without sampled tokens cannot be judged; sample more (rollout_check.prompts)")
    upper = 1.0 - alpha ** (1.0 / n) if k == 0 else 1.0  # Clopper-Pearson's upper bound of a rate with none seen
    result = {"p_value": 0.0 if k else 1.0, "equivalent": k == 0 and upper < margin, "candidate_rate": k / n,
              "candidate_outside": k, "upper_rate": upper, "margin": margin, "exact": True,
              "unjudged": own["unjudged"]}
    if not result["equivalent"] and k == 0:
        result["needed_factor"] = max(1.0, -math.log(alpha) / margin / n)
    return result


def own_score_test(own: dict, *, alpha: float) -> dict:
    """The mean of log q(x) + H(q) at every position where the settings leave a choice, q from the sampler's own
    logits: 0 under correct sampling, its variance known; two-sided z, and equivalence within the shifts samplers
    hotter and colder by temperature_margin would cause there (TOST, each side at that sampler's variance)."""
    from scipy.stats import norm

    n, variance = own["scored"], own["variance"]
    if n == 0 or variance == 0:
        return {"p_value": 1.0, "difference": None, "se": None, "z": None, "margin": None, "margins": [None, None],
                "equivalent": False, "no_variation": True, "exact": True, "candidate_z": None,
                "reason": "no position where the settings leave a choice"}
    mean, se = own["score"] / n, math.sqrt(variance) / n
    hot, cold = own["hot_shift"] / n, own["cold_shift"] / n
    crit = _z(1 - alpha)
    se_hot, se_cold = math.sqrt(own["hot_variance"]) / n, math.sqrt(own["cold_variance"]) / n
    z = mean / se
    result = {"p_value": float(2 * norm.sf(abs(z))), "difference": mean, "se": se, "z": z, "candidate_z": z,
              "margin": min(-hot, cold), "margins": [hot, cold], "exact": True, "positions": n,
              "equivalent": hot < 0 < cold and mean - crit * se_hot > hot and mean + crit * se_cold < cold}
    if not result["equivalent"]:
        result["needed_factor"] = _factor(max(se_hot, se_cold), min(-hot, cold), alpha)
    return result


def _prompt_mean(run: dict) -> tuple[float, float, int] | None:
    """A check's mean |logp difference| a token, its standard error over prompts (a ratio estimator), and the
    prompts; None where it reported no logits."""
    if not run.get("sampler_logits"):
        return None
    by_prompt: dict[int, list] = {}
    for c in run["completions"]:
        if c.get("numerics_tokens"):
            total = by_prompt.setdefault(c["prompt"], [0.0, 0])
            total[0] += c["abs_diff"]
            total[1] += c["numerics_tokens"]
    if not by_prompt:
        return None
    sums, counts = [t[0] for t in by_prompt.values()], [t[1] for t in by_prompt.values()]
    k, mean = len(sums), sum(sums) / sum(counts)
    spread = sum((s - mean * c) ** 2 for s, c in zip(sums, counts, strict=True)) * k / max(k - 1, 1)
    return mean, math.sqrt(spread) / sum(counts), k


def numerics_test(reference: dict, candidate: dict, *, alpha: float, bound: float = NUMERICS_BOUND) -> dict:
    """The candidate's mean |sampler - trainer| log-probability against `bound` (one-sided at alpha each way:
    divergent beyond, equivalent within), and its ratio to the reference's mismatch (a property, shown)."""
    from scipy.stats import norm

    ref, cand = _prompt_mean(reference), _prompt_mean(candidate)
    if ref is None or cand is None:
        side = "the reference" if ref is None else "this backend"
        return {"p_value": 1.0, "equivalent": False, "not_reported": True, "candidate_mean": cand and cand[0],
                "reference_mean": ref and ref[0], "reason": f"{side} reported no logits of its sampler"}
    excess, se = cand[0] - bound, cand[1]
    z = excess / se if se > 0 else math.copysign(math.inf, excess) if excess else 0.0
    result = {"p_value": float(norm.sf(z)), "difference": excess, "se": se, "candidate_mean": cand[0],
              "reference_mean": ref[0], "bound": bound, "margin": bound,
              "ratio_to_reference": cand[0] / ref[0] if ref[0] > 0 else None,
              "equivalent": excess + _z(1 - alpha) * se < 0}
    if not result["equivalent"] and excess < 0:
        result["needed_factor"] = _factor(se, -excess, alpha)
    return result


def own_check(run: dict, *, alpha: float, support_margin: float) -> dict:
    """The reference's own sampler judged on its own logits: the support and score tests alone (a 'comparison' of
    it with the settings, in the family finalize judges)."""
    own = own_totals(run)
    return {"reference": run["backend"], "candidate": run["backend"], "reference_seed": run["seed"],
            "candidate_seed": run["seed"], "alpha": alpha, "self": True, "fault": run.get("fault"),
            "tokens": {"reference": own["tokens"], "candidate": own["tokens"]},
            "completions": {"reference": len(run["completions"]), "candidate": len(run["completions"])},
            "numerics": {"reference": run.get("numerics"), "candidate": run.get("numerics")},
            "mismatch": {"reference": run.get("mismatch"), "candidate": run.get("mismatch")},
            "tests": {"support": own_support_test(own, alpha=alpha, margin=support_margin),
                      "score": own_score_test(own, alpha=alpha)}}


def _factor(se: float, margin: float, alpha: float) -> float:
    """How many times the samples would make two alike samplers pass the equivalence test CONFIRM_POWER of the time."""
    if margin <= 0:
        return math.inf
    target = margin / (_z(1 - alpha) + _z(0.5 + CONFIRM_POWER / 2))
    return max(1.0, (se / target) ** 2)
