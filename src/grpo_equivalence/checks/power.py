"""What the rollout check can detect at a study's settings, and how many tokens it needs: its power, stated.

From the logits it scores (grpo_equivalence.checks.scoring), the check knows per position what each named
sampling fault would change: the mean shift of the score and its variance at decided positions, the chance of
drawing a clearly-outside token, and the total variation from q. Summed over the tokens sampled (a "profile"),
these give, for a candidate and a reference of N tokens each:

- the score test's power: the shift against its standard error at N, two-sided, at Holm's first level
  (alpha / family, the level a lone fault in a report of correct samplers is judged at);
- the support test's power: the chance that the fault's clearly-outside count, Poisson at N x its rate, reaches
  the count the one-sided binomial test needs against the reference's;
- together, the chance that one of them calls it divergent (they look at different tokens: taken as independent);
- the chance that a correct sampler is confirmed equivalent: on the score test (TOST between the margin's hotter
  and colder samplers, each side at the variance its sampler would have) and on the two paired tests
  (completion_length, reward: TOST within their margin, the per-prompt difference's variance estimated from the
  spread of the check's own completions within each prompt), all three at once (taken as independent).

A fault whose total variation from q is below NO_EFFECT per token cannot change what is sampled at these settings
("top_k never binds here"); one that changes the distribution only where the rounding decides (no decided
position moves, no token it draws is clearly outside) cannot be told from rounding at this precision: both are
named as such, never counted as misses.

Where the backend reported the logits its sampler drew from (grpo_equivalence.checks.exact), its tests are one-sample,
against the settings applied to those logits (one_sample): the score's mean is 0 and its variance known under correct
sampling, and a correct sampler draws no token outside the support at all, so a single one is divergent.

The plan: the tokens that detect every detectable fault with TARGET power and confirm a correct sampler with
CONFIRM_TARGET. TARGET is 99 %: a fault planned at 90 % is caught in 19 or more of 20 repetitions only 39 % of the time,
at 99 % 98 % of the time; a correct sampler planned at 95 % is confirmed in 18 or more of 20 92 % of the time.
A rollout-check job samples rounds until its tokens reach the plan re-estimated from all rounds so far, or the
study's cap (rollout_check.max_rounds). The plan depends on the scorer's variances and the faults' shifts, never
on the score's value nor on any difference between backends (the paired tests' variances are the check's own,
within prompts): stopping on that information leaves the one final look at its level (tests/test_power.py
measures the false alarms of this design on synthetic samplers).
"""

import math
import statistics
from statistics import NormalDist

TARGET = 0.99  # the power the plan aims for, for each detectable fault
CONFIRM_TARGET = 0.95  # ... and for confirming a correct sampler
NO_EFFECT = 1e-6  # total variation per token below which a fault changes nothing at these settings
DETECTABLE, NO_CHANGE, ROUNDING_ONLY = "detectable", "no effect", "only where rounding decides"
_MOST = 10 ** 12  # tokens beyond which the plan says "not reachable"
# Each paired test of the rollout verdict and the value of a completion's record it compares. Here, not in
# rollout_verdict, which a sampling job must not depend on (its code reruns the jobs that depend on it)
PAIRED_FIELDS = {"completion_length": "tokens", "reward": "reward"}


# The standard normal as a plain function: a plan evaluates it some hundred thousand times (each size its bisection
# tries, per fault), where scipy.stats' frozen-distribution calls cost about 70 microseconds each.
NORMAL = NormalDist()


def empty_profile(names) -> dict:
    return {"tokens": 0, "scored": 0, "variance": 0.0, "outside_clear": 0, "hot_shift": 0.0, "hot_variance": 0.0,
            "cold_shift": 0.0, "cold_variance": 0.0,
            "effects": {n: {"shift": 0.0, "variance": 0.0, "outside": 0.0, "changed": 0.0} for n in names}}


def add(profile: dict, completion: dict, effects: dict | None = None) -> None:
    """A completion's sums (scoring.completion_sums) and effect sums (scoring.effect_sums) into `profile`."""
    for key in ("tokens", "scored", "variance", "outside_clear", "hot_shift", "hot_variance", "cold_shift",
                "cold_variance"):
        profile[key] += completion[key]
    for name, values in (effects or {}).items():
        for key, value in values.items():
            profile["effects"][name][key] += value


def merge(profile: dict, other: dict) -> None:
    """`other`'s sums (a profile of further rounds) into `profile`."""
    add(profile, other, other["effects"])


def per_token(profile: dict) -> dict:
    """The profile's rates: per token sampled (rates) and per scored position (means, variances)."""
    n, m = max(profile["tokens"], 1), max(profile["scored"], 1)
    return {"scored_share": profile["scored"] / n, "null_variance": profile["variance"] / m,
            "outside": profile["outside_clear"] / n,
            "hot": (profile["hot_shift"] / m, profile["hot_variance"] / m),
            "cold": (profile["cold_shift"] / m, profile["cold_variance"] / m),
            "effects": {name: {"shift": e["shift"] / m, "variance": e["variance"] / m, "outside": e["outside"] / n,
                               "changed": e["changed"] / n} for name, e in profile["effects"].items()}}


def _support_count(reference: int, level: float) -> int:
    """The smallest candidate count the one-sided binomial test (conditional on the sum) calls divergent at `level`
    beside `reference` tokens outside, with as many tokens sampled by each."""
    from scipy.special import bdtrc

    # P(count >= k) = P(Bin(k + reference, 1/2) <= reference) falls as k grows: bisect (k is near reference +
    # z sqrt(2 reference), hundreds of thousands at the sizes a plan tries)
    def divergent(k: int) -> bool:
        return bdtrc(k - 1, k + reference, 0.5) < level  # P(Bin(k + reference, 1/2) >= k)

    low, high = 0, 1
    while not divergent(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if divergent(middle) else (middle, high)
    return high


def detection_power(rates: dict, fault: str, tokens: int, level: float, one_sample: bool = False) -> float:
    """The chance that `fault` is called divergent with `tokens` sampled by it and by the reference (`one_sample`:
    by it alone, judged on its own logits)."""
    from scipy.special import pdtrc

    effect = rates["effects"][fault]
    positions = tokens * rates["scored_share"]
    score = 0.0
    crit = NORMAL.inv_cdf(1 - level / 2)
    if one_sample and positions > 0 and rates["null_variance"] > 0 and effect["shift"] != 0:
        # z = S / sqrt(n v0), S ~ N(n shift, n v_fault): z ~ N(sqrt(n) shift / sqrt(v0), v_fault / v0)
        mean = math.sqrt(positions) * effect["shift"] / math.sqrt(rates["null_variance"])
        sd = math.sqrt(max(effect["variance"], 1e-300) / rates["null_variance"])
        score = float(NORMAL.cdf((mean - crit) / sd) + NORMAL.cdf((-mean - crit) / sd))
    elif not one_sample and positions > 0 and rates["null_variance"] + effect["variance"] > 0 and effect["shift"]:
        ratio = abs(effect["shift"]) / math.sqrt((rates["null_variance"] + effect["variance"]) / positions)
        score = float(NORMAL.cdf(ratio - crit) + NORMAL.cdf(-ratio - crit))
    if one_sample:  # a correct sampler draws no token outside: one is divergent
        return 1 - (1 - score) * math.exp(-tokens * effect["outside"])
    reference = round(tokens * rates["outside"])
    expected = tokens * (effect["outside"] + rates["outside"])
    # P(Poisson(expected) >= the critical count)
    support = float(pdtrc(_support_count(reference, level) - 1, expected)) if effect["outside"] > 0 else 0.0
    return 1 - (1 - score) * (1 - support)


def paired_rates(completions: list[dict], margin_sd: float) -> dict:
    """Per paired test, what its chance to confirm two alike samplers depends on, from one check's own completions
    (their spread, never a difference from another backend's): the mean variance of a completion's value within a
    prompt, the margin (`margin_sd` standard deviations of a completion's value, as rollout_verdict.paired_test
    sets it) and the tokens sampled per completion with a value. A test whose completions all have one value is
    left out (the verdict leaves it out: "no variation")."""
    tokens = sum(c["tokens"] for c in completions)
    rates = {}
    for key, field in PAIRED_FIELDS.items():
        by_prompt: dict[int, list] = {}
        for c in completions:
            if math.isfinite(c[field]):
                by_prompt.setdefault(c["prompt"], []).append(c[field])
        values = [v for vs in by_prompt.values() for v in vs]
        within = [statistics.variance(vs) for vs in by_prompt.values() if len(vs) > 1]
        if len(values) < 2 or not within or statistics.pstdev(values) == 0:
            continue
        rates[key] = {"within": statistics.fmean(within), "margin": margin_sd * statistics.stdev(values),
                      "tokens_per_completion": tokens / len(values)}
    return rates


def paired_power(rate: dict, tokens: int, alpha: float) -> float:
    """The chance that a paired test confirms two alike samplers with `tokens` from each side: TOST of the mean
    per-prompt difference, whose variance is twice the within-prompt variance over the completions of a side."""
    completions = tokens / rate["tokens_per_completion"]
    if completions <= 0:
        return 0.0
    se = math.sqrt(2 * rate["within"] / completions)
    if se == 0:
        return 1.0
    return max(0.0, 2 * NORMAL.cdf(rate["margin"] / se - NORMAL.inv_cdf(1 - alpha)) - 1)


def equivalence_power(rates: dict, tokens: int, alpha: float, paired: dict | None = None,
                      one_sample: bool = False) -> float:
    """The chance that a correct sampler is confirmed equivalent with `tokens` from each side: on the score test,
    and on each paired test of `paired` (paired_rates), all at once."""
    both = 1.0
    for rate in (paired or {}).values():
        both *= paired_power(rate, tokens, alpha)
    return _score_equivalence_power(rates, tokens, alpha, one_sample) * both


def _score_equivalence_power(rates: dict, tokens: int, alpha: float, one_sample: bool = False) -> float:
    positions = tokens * rates["scored_share"]
    (hot, hot_var), (cold, cold_var) = rates["hot"], rates["cold"]
    if positions <= 0 or rates["null_variance"] <= 0 or hot >= 0 or cold <= 0:
        return 0.0
    norm = NORMAL
    crit = norm.inv_cdf(1 - alpha)
    # the reference's variance beside the candidate's, unless the candidate is judged on its own logits alone
    null = 0.0 if one_sample else rates["null_variance"]
    se = math.sqrt((rates["null_variance"] + null) / positions)
    low = hot + crit * math.sqrt((null + hot_var) / positions)
    high = cold - crit * math.sqrt((null + cold_var) / positions)
    return max(0.0, float(norm.cdf(high / se) - norm.cdf(low / se)))


def _needed(power, target: float = TARGET) -> int | None:
    """The fewest tokens at which power(tokens) reaches target; None: not below _MOST."""
    low, high = 0, 1000
    while power(high) < target:
        low, high = high, high * 2
        if high > _MOST:
            return None
    while high - low > max(1, high // 100):  # within 1 %
        middle = (low + high) // 2
        low, high = (middle, high) if power(middle) < target else (low, middle)
    return high


def kind(rates: dict, fault: str, one_sample: bool = False) -> str:
    """What a fault can do at these settings: nothing, change only what the rounding decides (never on a sampler's
    own logits, where nothing is left to the rounding), or something the tests can see."""
    effect = rates["effects"][fault]
    if effect["changed"] < NO_EFFECT:
        return NO_CHANGE
    if effect["outside"] <= 0 and abs(effect["shift"]) < 1e-12:
        return NO_CHANGE if one_sample else ROUNDING_ONLY
    return DETECTABLE


def plan(profile: dict, *, alpha: float, family: int, paired: dict | None = None, one_sample: bool = False) -> dict:
    """Per named fault its kind, the tokens it needs for TARGET power, and the tokens a correct sampler needs to be
    confirmed equivalent with CONFIRM_TARGET (on the paired tests of `paired` too: paired_rates); `tokens`: the most
    of these (None where one is not reachable). `one_sample`: the sampler judged on its own logits."""
    rates = per_token(profile)
    level = alpha / max(family, 1)
    faults_ = {}
    for fault in profile["effects"]:
        found = kind(rates, fault, one_sample)
        need = _needed(lambda n, f=fault: detection_power(rates, f, n, level, one_sample)) if found == DETECTABLE \
            else None
        faults_[fault] = {"kind": found, "tokens_needed": need, "changed_per_token": rates["effects"][fault]["changed"]}
    confirm = _needed(lambda n: equivalence_power(rates, n, alpha, paired, one_sample), CONFIRM_TARGET)
    needs = [f["tokens_needed"] for f in faults_.values() if f["kind"] == DETECTABLE] + [confirm]
    return {"faults": faults_, "confirm_tokens": confirm, "level": level,
            "tokens": None if None in needs else max(needs, default=0)}


def statements(profile: dict, tokens: int, *, alpha: float, family: int, paired: dict | None = None,
               one_sample: bool = False) -> list[dict]:
    """Per named fault, what the check detects at `tokens` a side: its kind, power and the tokens for TARGET power;
    and a correct sampler's chance to be confirmed equivalent (on the paired tests of `paired` too), and the tokens
    for CONFIRM_TARGET."""
    rates = per_token(profile)
    planned = plan(profile, alpha=alpha, family=family, paired=paired, one_sample=one_sample)
    rows = []
    for fault, found in planned["faults"].items():
        power = detection_power(rates, fault, tokens, planned["level"], one_sample) if found["kind"] == DETECTABLE \
            else None
        rows.append({"fault": fault, **found, "power": power, "target": TARGET})
    rows.append({"fault": None, "kind": "confirm equivalence", "tokens_needed": planned["confirm_tokens"],
                 "power": equivalence_power(rates, tokens, alpha, paired, one_sample), "changed_per_token": 0.0,
                 "target": CONFIRM_TARGET, "score_power": _score_equivalence_power(rates, tokens, alpha, one_sample),
                 "paired_power": {key: paired_power(rate, tokens, alpha) for key, rate in (paired or {}).items()}})
    return rows
