import json

import pytest

from grpo_equivalence.analysis import stats
from grpo_equivalence.analysis.compare import NOT_LOGGED, compare
from grpo_equivalence.analysis.stats import StatsError
from grpo_equivalence.analysis.summary import summarise
from helpers import make_stats


def test_median_step_leaves_out_the_warm_up():
    walls = {1: 30.0, 2: 20.0, 3: 10.0, 4: 1.0, 5: 3.0, 6: 2.0}
    summary = summarise(make_stats(n=6, wall=walls.get), skip=3)
    assert summary["median_step_s"] == 2.0
    assert summary["median_over_steps"] == [4, 6]
    assert summary["train_wall_s"] == 60.0 and summary["peak_mem_gb"] == pytest.approx(1.06)
    assert summary["steps_with_reward_signal"] == 6  # frac_reward_zero_std 0.25 at every step


def test_bandwidth_floor_is_the_weights_over_the_measured_bandwidth():
    run = make_stats(n=6)
    assert summarise(run)["bandwidth_floor_ms"] is None  # neither recorded: not recorded, never 0
    run["model_bytes"] = 8_000_000_000
    assert summarise(run)["bandwidth_floor_ms"] is None  # bandwidth measured only on CUDA
    run["environment"]["memory_bandwidth_gbs"] = 4000.0
    assert summarise(run)["bandwidth_floor_ms"] == pytest.approx(2.0)


def test_steps_with_signal_counts_steps_where_some_group_varied():
    run = make_stats(n=4)
    for step, fraction in zip(run["steps"], (1.0, 0.5, 1.0, 0.0)):
        step["metrics"]["frac_reward_zero_std"] = fraction
    assert summarise(run, skip=3)["steps_with_reward_signal"] == 2
    del run["steps"][0]["metrics"]["frac_reward_zero_std"]
    assert summarise(run, skip=3)["steps_with_reward_signal"] is None  # not logged, never 0


def test_summary_needs_steps_after_the_warm_up():
    with pytest.raises(StatsError, match="leave none after skipping 3"):
        summarise(make_stats(n=3), skip=3)


def test_compare_max_and_mean_abs_diff_on_aligned_steps():
    ref = make_stats("vllm", 4, reward=lambda i: float(i))
    cand = make_stats("cb_paged", 4, reward=lambda i: float(i) + (0.5 if i == 3 else -0.1))
    result = compare([ref], [cand])
    reward = result["metrics"]["reward"]
    assert reward["max_abs_diff"] == pytest.approx(0.5) and reward["at_step"] == 3
    assert reward["mean_abs_diff"] == pytest.approx((0.1 + 0.1 + 0.5 + 0.1) / 4)
    assert result["metrics"]["loss"]["max_abs_diff"] == 0.0
    assert result["candidate"] == "cb_paged" and result["reference"] == "vllm" and result["steps_compared"] == 4


def test_metric_missing_in_one_run_is_not_logged_never_zero():
    ref = make_stats("vllm", 4)
    cand = make_stats("hf", 4, kl=lambda i: None)
    kl = compare([ref], [cand])["metrics"]["kl"]
    assert kl["status"] == NOT_LOGGED and kl["not_logged_in"] == ["hf x 4 (seed 3407)"]
    assert kl["verdict"] == {"verdict": "not logged", "not_logged_in": ["hf x 4 (seed 3407)"],
                             "reason": "not logged in hf x 4 (seed 3407)"}


def test_nan_fails_loudly():
    cand = make_stats("hf", 4, loss=lambda i: float("nan") if i == 2 else 0.1)
    with pytest.raises(StatsError, match="loss is nan at step 2"):
        compare([make_stats("vllm", 4)], [cand])


def test_a_metric_logged_at_other_steps_than_the_references_fails_naming_them():
    """A metric absent at some steps is absent there (num_iterations > 1 logs the rollout's metrics at the steps that
    sampled); runs that logged it at other steps than each other cannot be set side by side step by step."""
    cand = make_stats("hf", 4, kl=lambda i: None if i == 3 else 0.1)
    with pytest.raises(StatsError, match="kl is logged at other steps"):
        compare([make_stats("vllm", 4)], [cand])
    both = [make_stats(b, 4, kl=lambda i: None if i % 2 == 0 else 0.1) for b in ("vllm", "hf")]
    assert compare([both[0]], [both[1]])["metrics"]["kl"]["status"] == "compared"


def test_runs_of_different_length_fail():
    with pytest.raises(StatsError, match="different length"):
        compare([make_stats("vllm", 6)], [make_stats("hf", 5)])


def test_replicates_give_a_noise_floor_and_verdicts():
    refs = [make_stats("vllm", 6, seed=3407 + i, reward=lambda t, i=i: 2.0 + 0.1 * i + 0.01 * t) for i in range(3)]
    same = [make_stats("hf", 6, seed=3407 + i, reward=lambda t, i=i: 2.0 + 0.1 * i + 0.001 * i + 0.01 * t)
            for i in range(3)]
    shifted = [make_stats("hf", 6, seed=3407 + i, reward=lambda t, i=i: 9.0 + 0.1 * i + 0.01 * t) for i in range(3)]
    result = compare(refs, same)
    assert result["reference_seeds"] == [3407, 3408, 3409] and result["candidate_seeds"] == [3407, 3408, 3409]
    assert result["metrics"]["reward"]["seed_floor"] == pytest.approx((0.1 + 0.2 + 0.1) / 3)
    reward = result["metrics"]["reward"]["verdict"]
    assert reward["verdict"] == "equivalent" and reward["design"] == "paired by seed"  # the same seeds, nearly the same
    assert compare(refs, shifted)["metrics"]["reward"]["verdict"]["verdict"] == "divergent"
    # one candidate run is before the first planned look: inconclusive, with the look it waits for
    one = compare(refs, same[:1])["metrics"]["reward"]["verdict"]
    assert one["verdict"] == "inconclusive" and one["next_runs"] == 3
    assert result["metrics_judged"] == ["loss", "reward", "kl", "grad_norm", "completion_length", "entropy"]


def test_runs_of_one_role_must_be_one_backend_with_distinct_seeds():
    with pytest.raises(StatsError, match="repeat a seed"):
        compare([make_stats("vllm", 4), make_stats("vllm", 4)], [make_stats("hf", 4)])
    with pytest.raises(StatsError, match="several backends"):
        compare([make_stats("vllm", 4), make_stats("hf", 4, seed=1)], [make_stats("hf", 4)])


def with_reward_function(run, values):
    for step, value in zip(run["steps"], values, strict=True):
        step["metrics"]["rewards/my_reward/mean"] = value
    return run


def test_a_reward_function_that_scored_nothing_is_named_and_not_judged_instead_of_failing_the_report():
    """A reward function returning None (or NaN) for every completion: TRL logs NaN as its mean. It is named with
    the reason, and the other metrics are judged as before (it used to end the report as a 'diverged run')."""
    nan = float("nan")
    reference = [with_reward_function(make_stats("hf", seed=s), [1.0] * 6) for s in (3407, 3408, 3409)]
    candidate = [with_reward_function(make_stats("cb_paged", seed=s), [nan] * 6) for s in (3407, 3408, 3409)]
    result = compare(reference, candidate)
    assert "my_reward" not in result["reward_functions"]
    assert result["reward_functions_not_judged"] == {"my_reward": "scored no completion at every step of cb_paged x 6 "
                                                     "(seed 3407) (it returned None or NaN for every completion there)"}
    candidate[0]["steps"][2]["metrics"]["rewards/my_reward/mean"] = 1.0
    assert "at step(s) 1, 2, 4, 5, 6" in compare(reference, candidate)["reward_functions_not_judged"]["my_reward"]
    judged = compare(reference, [with_reward_function(make_stats("cb_paged", seed=s), [1.0] * 6)
                                 for s in (3407, 3408, 3409)])
    assert "my_reward" in judged["reward_functions"] and judged["reward_functions_not_judged"] == {}


def test_a_reward_functions_metric_that_is_not_a_number_is_refused_naming_run_step_and_metric(tmp_path):
    run = with_reward_function(make_stats("hf"), [1.0, 1.0, "abc", 1.0, 1.0, 1.0])
    path = tmp_path / "grpo_hf_6.json"
    path.write_text(json.dumps(run))  # as an edited or foreign file has it: a train job never writes it (stats.write)
    with pytest.raises(stats.StatsError, match=r"grpo_hf_6.json: step 3: metrics.rewards/my_reward/mean is str "
                                               r"\"abc\", not a number"):
        stats.load(path)
