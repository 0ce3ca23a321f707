"""The verdict on synthetic runs whose answer is known, and the cases where it must not pass silently.

The calibration tests draw thousands of synthetic comparisons (grpo_equivalence.analysis.calibration); their bounds
allow for the sampling error of that many trials (3 standard errors), and their seeds are fixed.
"""

import math

import pytest

from grpo_equivalence.analysis import calibration, sequential, verdict
from grpo_equivalence.analysis.stats import StatsError
from helpers import make_stats

PROCESS = calibration.Process()
METRICS = 6


def bound(rate: float, trials: int) -> float:
    return rate + 3 * math.sqrt(rate * (1 - rate) / trials)


@pytest.mark.parametrize("runs", [3, 5, 12])
def test_two_seeds_of_one_process_are_called_divergent_at_most_alpha_of_the_time(runs):
    rate = calibration.any_divergent_rate(PROCESS, metrics=METRICS, reference_runs=runs, candidate_runs=runs,
                                          trials=1000, seed=1, headline=len(verdict.HEADLINE))
    assert rate <= bound(verdict.ALPHA, 1000), rate


def test_a_shift_as_large_as_the_margin_is_called_equivalent_at_most_alpha_of_the_time():
    rates = calibration.rates(PROCESS, shift_sd=verdict.MARGIN * math.sqrt(2), reference_runs=5, candidate_runs=5,
                              trials=2000, seed=2)
    assert rates[verdict.EQUIVALENT] <= bound(verdict.ALPHA, 2000), rates


def test_the_planned_looks_keep_both_error_rates_at_alpha_and_decide():
    same = calibration.sequential_rates(PROCESS, shift_sd=0.0, trials=600, seed=5)
    at_margin = calibration.sequential_rates(PROCESS, shift_sd=verdict.MARGIN * math.sqrt(2), trials=600, seed=6)
    assert same[verdict.DIVERGENT] <= bound(verdict.ALPHA, 600) and same[verdict.EQUIVALENT] > 0.7, same
    assert at_margin[verdict.EQUIVALENT] <= bound(verdict.ALPHA, 600), at_margin


def test_the_same_process_with_enough_runs_is_called_equivalent_most_of_the_time():
    rates = calibration.rates(PROCESS, shift_sd=0.0, reference_runs=12, candidate_runs=12, trials=1000, seed=3)
    # one metric alone at the last look: divergent at about that look's alpha (three standard errors allowed)
    assert rates[verdict.EQUIVALENT] > 0.7 and rates[verdict.DIVERGENT] < sequential.look(12)["alpha"] + 0.015, rates


def test_a_large_shift_is_detected():
    rates = calibration.rates(PROCESS, shift_sd=4.0, reference_runs=5, candidate_runs=5, trials=500, seed=4)
    assert rates[verdict.DIVERGENT] >= 0.8 and rates[verdict.EQUIVALENT] == 0.0, rates


def test_shared_seeds_are_compared_in_pairs_and_pairing_confirms_equivalence_more_often():
    strongly_paired = calibration.Process(shared=0.9)
    paired = calibration.rates(strongly_paired, shift_sd=0.0, reference_runs=5, candidate_runs=5, trials=800, seed=7)
    rng, unpaired_equivalent = __import__("random").Random(7), 0
    for _ in range(800):
        reference, candidate = strongly_paired.pair(rng, 5, 5)
        unpaired_equivalent += verdict.judge(reference, candidate)["verdict"] == verdict.EQUIVALENT  # no seeds given
    assert paired[verdict.EQUIVALENT] > unpaired_equivalent / 800 + 0.1, (paired, unpaired_equivalent)
    result = verdict.judge([1.0, 2.0, 3.0], [1.1, 2.1, 3.1], reference_seeds=[1, 2, 3], candidate_seeds=[1, 2, 3])
    assert result["design"] == "paired by seed" and result["paired_seeds"] == 3 and result["difference_sd"] < 1e-9


def test_the_equivalence_bound_is_finite_where_the_noncentral_t_was_not():
    import random

    rng = random.Random(0)
    for margin in (1.0, 2.0):
        for _ in range(50):
            reference = [rng.gauss(0, 1) for _ in range(26)]
            candidate = [rng.gauss(rng.uniform(-1, 1), 1) for _ in range(26)]
            result = verdict.judge(reference, candidate, margin=margin)  # unpaired: Wellek's bound
            assert result["verdict"] in (verdict.EQUIVALENT, verdict.DIVERGENT, verdict.INCONCLUSIVE)
    assert math.isfinite(sequential.equivalence_bound(50, 14.0, 0.0125))
    # the noncentral F form agrees with the noncentral t it replaces, where that one is finite
    from scipy.optimize import brentq
    from scipy.stats import nct

    c = brentq(lambda x: nct.cdf(x, 8, 2.0) - nct.cdf(-x, 8, 2.0) - 0.05, 0, 10)
    assert sequential.equivalence_bound(8, 2.0, 0.05) == pytest.approx(c, abs=1e-5)


def test_one_reference_run_is_inconclusive_never_equivalent():
    result = verdict.judge([1.0], [1.0])
    assert result["verdict"] == verdict.INCONCLUSIVE and "at least 2 seeds of the reference" in result["reason"]


def test_before_the_first_planned_look_is_inconclusive_with_the_next_look_and_its_power():
    result = verdict.judge([1.0, 1.2], [1.15, 1.1], reference_seeds=[1, 2], candidate_seeds=[1, 2])
    assert result["verdict"] == verdict.INCONCLUSIVE and result["look"] == 0 and result["next_runs"] == verdict.LOOKS[0]
    assert 0 <= result["next_power_equivalent"] <= 1 and 0 <= result["next_power_divergent"] <= 1
    later = verdict.judge([1.0, 1.2, 0.9, 1.1], [1.1, 1.0, 1.2, 0.9], reference_seeds=[1, 2, 3, 4],
                          candidate_seeds=[1, 2, 3, 4])
    assert later["look"] == 1 and later["next_runs"] == verdict.LOOKS[1] and later["alpha"] == result["alpha"]
    assert "next look at 5 runs" in later["reason"]


def test_the_looks_spend_alpha_in_proportion_to_their_runs():
    """The chance that a z-statistic observed at every look crosses a boundary by look k is alpha x n_k / 12:
    checked with scipy's multivariate normal probabilities (nested means: correlation sqrt(n_i / n_j))."""
    import numpy as np
    from scipy.stats import multivariate_normal, norm

    nominal = sequential.look_alphas(0.05)
    assert nominal[0] == pytest.approx(0.05 * 3 / 12, abs=1e-9)  # the first look: its increment, as before
    assert nominal[-1] > 2 * 0.05 / len(verdict.LOOKS)  # the last look gains from sharing runs with the others
    t = np.array(verdict.LOOKS) / verdict.LOOKS[-1]
    corr = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    bound = norm.isf(np.array(nominal) / 2)
    for k in range(2, len(verdict.LOOKS) + 1):
        inside = multivariate_normal(np.zeros(k), corr[:k, :k]).cdf(bound[:k], lower_limit=-bound[:k],
                                                                     rng=np.random.default_rng(0))
        assert 1 - inside == pytest.approx(0.05 * t[k - 1], abs=2e-4)
    assert sequential.look(12)["alpha"] == nominal[-1] and sequential.look(40)["alpha"] == nominal[-1]


def test_holm_over_a_family_is_stricter_than_each_test_alone():
    assert sequential.holm([0.01, 0.04, 0.03], 0.05) == [True, False, False]
    assert sequential.holm([0.01, 0.02, 0.03], 0.05) == [True, True, True]
    one = verdict.judge([0.0, 1.0, 2.0, 0.5, 1.5], [3.0, 4.1, 5.0, 3.6, 4.4], reference_seeds=[1, 2, 3, 4, 5],
                        candidate_seeds=[1, 2, 3, 4, 5])
    assert one["verdict"] == verdict.DIVERGENT
    weak = dict(one, p_value=one["alpha"] * 0.9)
    family = verdict.finalize([weak] + [dict(one, p_value=0.5) for _ in range(9)])
    assert family[0]["verdict"] != verdict.DIVERGENT and family[0]["family_size"] == 10


def test_weighted_holm_gives_the_headline_tests_their_share_of_alpha():
    assert sequential.holm([0.01, 0.04, 0.03], 0.05, [1.0, 1.0, 1.0]) == sequential.holm([0.01, 0.04, 0.03], 0.05)
    # one headline test among nine others: 0.8 of alpha for it at Holm's first step, not a tenth
    p = [0.03] + [0.5] * 9
    assert sequential.holm(p, 0.05) == [False] * 10
    assert sequential.holm(p, 0.05, verdict.headline_weights([True] + [False] * 9))[0]
    assert not sequential.holm([0.041] + [0.5] * 9, 0.05, verdict.headline_weights([True] + [False] * 9))[0]
    # a rejection passes its weight on: the other test then gets all of alpha
    assert sequential.holm([0.001, 0.049], 0.05, [0.8, 0.2]) == [True, True]
    assert verdict.headline_weights([True, True]) == [1.0, 1.0]


def test_a_report_weights_its_headline_cells_and_says_so():
    one = verdict.judge([0.0, 1.0, 2.0, 0.5, 1.5], [3.0, 4.1, 5.0, 3.6, 4.4], reference_seeds=[1, 2, 3, 4, 5],
                        candidate_seeds=[1, 2, 3, 4, 5])
    # p just below the look's alpha x 0.8 / 3: divergent as one of three headline tests beside 12 others, not
    # in an unweighted family of 15
    family = lambda: [dict(one, p_value=one["alpha"] * 0.8 / 3 * 0.99)] + [dict(one, p_value=0.5)  # noqa: E731
                                                                          for _ in range(14)]
    weighted = verdict.finalize(family(), [True, True, True] + [False] * 12)
    assert weighted[0]["verdict"] == verdict.DIVERGENT and weighted[0]["headline"]
    assert "the 3 headline tests sharing 80% of it" in weighted[0]["reason"]
    assert verdict.finalize(family())[0]["verdict"] != verdict.DIVERGENT


def test_each_metric_is_summarised_as_planned():
    assert verdict.summary("kl", [0.0] * 6 + [1.0, 2.0, 3.0]) == pytest.approx(math.log(2.0))
    assert verdict.summary("grad_norm", [1.0, 3.0]) == pytest.approx(math.log(2.0))
    assert verdict.summary("reward", [1.0, 3.0]) == 2.0


def test_no_seed_to_seed_noise_is_judged_exactly():
    seeds = dict(reference_seeds=[1, 2, 3], candidate_seeds=[1, 2, 3])
    assert verdict.judge([2.0, 2.0, 2.0], [2.0, 2.0, 2.0], **seeds)["verdict"] == verdict.EQUIVALENT
    assert verdict.judge([2.0, 2.0, 2.0], [2.5, 2.5, 2.5], **seeds)["verdict"] == verdict.DIVERGENT


def test_nan_is_an_error_never_a_verdict():
    refs = [make_stats("vllm", 6, seed=s) for s in (1, 2, 3)]
    cand = [make_stats("hf", 6, reward=lambda t: float("nan") if t == 4 else 1.0)]
    with pytest.raises(StatsError, match="reward is nan at step 4; the run diverged"):
        verdict.judge_runs(refs, cand, "reward")


def test_a_metric_missing_from_one_run_is_not_logged():
    refs = [make_stats("vllm", 6, seed=s) for s in (1, 2, 3)]
    refs[1]["steps"] = [dict(step, metrics={}) for step in refs[1]["steps"]]  # no entropy in one reference seed
    result = verdict.judge_runs(refs, [make_stats("hf", 6)], "entropy")
    assert result["verdict"] == verdict.NOT_LOGGED and result["not_logged_in"] == ["vllm x 6 (seed 2)"]


def test_runs_of_different_lengths_are_an_error():
    with pytest.raises(StatsError, match="different length"):
        verdict.judge_runs([make_stats("vllm", 6, seed=1), make_stats("vllm", 5, seed=2)], [make_stats("hf", 6)], "loss")


def _pairs(n: int, mean: float, sd: float, seed: int = 0):
    """n reference summaries and candidates whose paired differences have exactly `mean` and `sd`."""
    import random
    import statistics

    rng = random.Random(seed)
    reference = [rng.gauss(0, 0.3) for _ in range(n)]
    raw = [rng.gauss(0, 1) for _ in range(n)]
    m, s = statistics.fmean(raw), statistics.stdev(raw)
    return reference, [r + mean + sd * (x - m) / s for r, x in zip(reference, raw)]


def test_an_open_verdict_at_the_last_look_says_how_many_runs_would_decide_it_and_they_would():
    """At the last planned look a difference as large as the margin cannot be shown equivalent; the reason
    estimates the runs that would show it divergent at the spread measured, and runs of that number with that
    difference and spread are."""
    import re

    seeds = list(range(12))
    reference, candidate = _pairs(12, 1.4, 1.1)
    judged = verdict.judge(reference, candidate, tests=75, reference_seeds=seeds, candidate_seeds=seeds)
    assert judged["verdict"] == "inconclusive" and judged["look"] == judged["looks"]
    assert abs(judged["difference"]) >= judged["margin"] and "equivalence cannot be shown" in judged["reason"]
    runs = int(re.search(r"divergent at about (\d+) runs", judged["reason"]).group(1))
    assert runs > 12
    fewer, enough = _pairs(runs - 1, 1.4, 1.1), _pairs(runs, 1.4, 1.1)
    judge = lambda pair: verdict.judge(*pair, tests=75, reference_seeds=list(range(len(pair[0]))),  # noqa: E731
                                       candidate_seeds=list(range(len(pair[0]))))["p_value"]
    alpha = judged["alpha"] / 75
    assert judge(enough) <= alpha < judge(fewer)
