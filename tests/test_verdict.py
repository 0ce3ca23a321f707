"""The verdict on synthetic runs whose answer is known, and the cases where it must not pass silently.

The calibration tests draw thousands of synthetic comparisons (grpo_equivalence.calibration); their bounds
allow for the sampling error of that many trials (3 standard errors), and their seeds are fixed.
"""

import math

import pytest

from grpo_equivalence import calibration, verdict
from grpo_equivalence.stats import StatsError
from helpers import make_stats

PROCESS = calibration.Process()
METRICS = 6


def bound(rate: float, trials: int) -> float:
    return rate + 3 * math.sqrt(rate * (1 - rate) / trials)


@pytest.mark.parametrize("reference_runs, candidate_runs", [(3, 1), (5, 5)])
def test_two_seeds_of_one_process_are_called_divergent_at_most_alpha_of_the_time(reference_runs, candidate_runs):
    rate = calibration.any_divergent_rate(PROCESS, metrics=METRICS, reference_runs=reference_runs,
                                          candidate_runs=candidate_runs, trials=1500, seed=1)
    assert rate <= bound(verdict.ALPHA, 1500), rate


def test_a_shift_as_large_as_the_margin_is_called_equivalent_at_most_alpha_of_the_time():
    rates = calibration.rates(PROCESS, shift_sd=verdict.MARGIN * math.sqrt(2), reference_runs=5, candidate_runs=5,
                              trials=2000, tests=METRICS, seed=2)
    assert rates[verdict.EQUIVALENT] <= bound(verdict.ALPHA, 2000), rates


def test_the_same_process_with_enough_runs_is_called_equivalent_most_of_the_time():
    rates = calibration.rates(PROCESS, shift_sd=0.0, reference_runs=8, candidate_runs=8, trials=1000, tests=METRICS, seed=3)
    assert rates[verdict.EQUIVALENT] > 0.6 and rates[verdict.DIVERGENT] < 0.02, rates


def test_a_large_shift_is_detected():
    rates = calibration.rates(PROCESS, shift_sd=4.0, reference_runs=5, candidate_runs=5, trials=500, tests=METRICS, seed=4)
    assert rates[verdict.DIVERGENT] >= 0.8 and rates[verdict.EQUIVALENT] == 0.0, rates


def test_one_reference_run_is_inconclusive_never_equivalent():
    result = verdict.judge([1.0], [1.0])
    assert result["verdict"] == verdict.INCONCLUSIVE and "at least 2 seeds of the reference" in result["reason"]


def test_too_few_runs_say_how_many_would_settle_it():
    result = verdict.judge([1.0, 1.2, 0.9], [1.15])
    assert result["verdict"] == verdict.INCONCLUSIVE and result["needed_runs"] > 3
    assert f"{result['needed_runs']} runs of each backend would likely show it" in result["reason"]
    assert verdict.judge([1.0, 1.2, 0.9, 1.1, 1.0] * 3, [1.04, 1.05, 1.06, 1.05] * 3)["verdict"] == verdict.EQUIVALENT


def test_no_seed_to_seed_noise_is_judged_exactly():
    assert verdict.judge([2.0, 2.0, 2.0], [2.0])["verdict"] == verdict.EQUIVALENT
    assert verdict.judge([2.0, 2.0, 2.0], [2.5])["verdict"] == verdict.DIVERGENT


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
