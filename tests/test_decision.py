"""One decision per candidate from all its evidence (analysis.decision), its effects with intervals (analysis.effects)
and the advice on what would decide what is open (analysis.advice)."""

import math
import random

import pytest

from grpo_equivalence.analysis import advice, decision, effects, verdict

SEEDS = list(range(12))


def judged(differences, *, margin=None, family=9, runs=None):
    """A verdict of paired runs whose differences are `differences` (the reference's summaries drawn), finalized in a
    family of `family` equal tests."""
    rng = random.Random(1)
    reference = [rng.gauss(0, 1) for _ in differences]
    candidate = [r + d for r, d in zip(reference, differences, strict=True)]
    n = runs or len(differences)
    result = verdict.judge(reference[:n], candidate[:n], margin=margin or {"absolute": 1.0}, tests=family,
                           reference_seeds=SEEDS[:n], candidate_seeds=SEEDS[:n])
    others = [dict(result, p_value=0.9) for _ in range(family - 1)]
    return verdict.finalize([result, *others])[0]


def pair(results: dict, steps=30):
    """A comparison as compare returns it, of `results` ({metric: verdict}), each with its effect."""
    return {"max_steps": steps, "reward_functions": {},
            "metrics": {m: {"verdict": {**r, "effect": effects.effect(m, r)}} for m, r in results.items()}}


def test_an_effect_is_said_in_the_metrics_terms_with_what_it_rules_out():
    result = judged([math.log(0.78) + 0.05 * x for x in (-1, 1, 0, -1, 1, 0, 1, -1, 0, 1, -1, 0)],
                    margin={"ratio": 1.25})
    found = effects.effect("grad_norm", result)
    assert found["scale"] == "ratio" and found["estimate"] == pytest.approx(0.78, abs=0.01)
    assert found["low"] < 0.78 < found["high"] < 1.0
    assert effects.words(found).startswith("0.78x (")
    far = max(1 / found["low"], found["high"])
    assert effects.ruled_out(found) == f"a change beyond {far:.2f}x either way"
    units = effects.effect("reward", judged([0.1] * 6 + [0.3] * 6))
    assert units["scale"] == "difference" and effects.words(units).startswith("+0.2 (")
    assert effects.effect("reward", {"verdict": "not logged"}) is None


def test_the_interval_is_the_looks_repeated_confidence_interval():
    """Half its width is the two-sided boundary of the whole alpha at the look, times the standard error."""
    from grpo_equivalence.analysis import sequential

    result = judged([0.2, 0.5, -0.1, 0.4, 0.3, 0.0, 0.6, 0.2], runs=8)
    se = result["difference_sd"] / math.sqrt(8)
    low, high = result["interval"]
    assert (high - low) / 2 == pytest.approx(sequential.boundaries(0.05)[2] * se)
    assert (high + low) / 2 == pytest.approx(result["difference"])


def test_a_divergent_metric_decides_whatever_its_headline_weight():
    grad = judged([math.log(0.78) + 0.03 * x for x in (-1, 1, 0, -1, 1, 0, 1, -1, 0, 1, -1, 0)],
                  margin={"ratio": 1.25})
    assert grad["verdict"] == verdict.DIVERGENT
    same = judged([0.01 * x for x in (-1, 1, 0, -1, 1, 0, 1, -1, 0, 1, -1, 0)])
    found = decision.decide("hf+drop_weakest", "hf", [pair({"grad_norm": grad, "kl": same, "reward": same,
                                                             "completion_length": same})])
    assert found["decision"] == decision.DIFFERENT
    said = decision.words(found)
    assert said.startswith("**trains differently** from hf: grad_norm 0.78x (") and "at 30 steps" in said


def test_the_same_training_needs_every_headline_metric_equivalent_and_nothing_differing():
    same = judged([0.01 * x for x in (-1, 1, 0, -1, 1, 0, 1, -1, 0, 1, -1, 0)])
    rollout = {"tests": {"support": {"verdict": "equivalent", "exact": True}, "score": {"verdict": "equivalent"},
                         "numerics": {"verdict": "equivalent", "candidate_mean": 0.0043, "reference_mean": 0.00094,
                                      "bound": 0.009}},
               "sampler_said": "correct (on its own logits)"}
    found = decision.decide("native", "hf", [pair({m: same for m in verdict.HEADLINE})], rollout=rollout,
                            trainer={"first": None})
    assert found["decision"] == decision.SAME
    assert decision.words(found).startswith("**trains as hf**: sampler correct, the same step; the runs: kl ")
    # numerics a property: said as a ratio, never a reason
    assert any(c.startswith("numerics 4.6x hf's mismatch") for c in found["caveats"])
    beyond = {**rollout, "tests": {**rollout["tests"], "numerics": {**rollout["tests"]["numerics"],
                                                                     "verdict": "divergent", "candidate_mean": 0.012}}}
    assert decision.decide("native", "hf", [pair({m: same for m in verdict.HEADLINE})], rollout=beyond,
                           trainer={"first": None})["decision"] == decision.DIFFERENT
    parting = decision.decide("native", "hf", [pair({m: same for m in verdict.HEADLINE})], trainer={"first": "loss"})
    assert parting["decision"] == decision.DIFFERENT and "parts from hf's at the loss" in decision.words(parting)


def test_a_sampler_wrong_on_its_own_logits_decides_only_where_the_references_own_was_right():
    same = judged([0.01 * x for x in (-1, 1, 0, -1, 1, 0, 1, -1, 0, 1, -1, 0)])
    rollout = {"tests": {"support": {"verdict": "equivalent", "exact": True}, "score": {"verdict": "divergent"},
                         "numerics": {"not_reported": True}},
               "sampler_said": "**divergent** (score z +13.2 (too cold or keeping fewer tokens); on its own logits)"}
    pairs = [pair({m: same for m in verdict.HEADLINE})]
    shared = decision.decide("trl_vllm", "vllm", pairs, rollout=rollout)
    assert shared["decision"] == decision.SAME and "both may share it" in shared["caveats"][0]
    assert decision.decide("trl_vllm", "hf", pairs, rollout=rollout,
                           reference_sampler_correct=True)["decision"] == decision.DIFFERENT


def test_an_open_decision_says_what_the_runs_rule_out_and_what_would_decide_it():
    near = judged([0.3, -0.2, 0.5, 0.1], runs=3)
    assert near["verdict"] == verdict.INCONCLUSIVE
    found = decision.decide("hf_static", "hf", [pair({"kl": near, "reward": near, "completion_length": near})],
                            costs={30: (40.0, 20.0)})
    assert found["decision"] == decision.OPEN
    said = decision.words(found)
    assert said.startswith("**not decided**: kl ") and ", ruling out a change beyond " in said
    cell = found["open"][0]
    look = cell["advice"]["look"]
    assert look["either"] >= advice.FLOOR and look["runs"] in verdict.LOOKS[1:]
    assert cell["advice"]["device_s"] == pytest.approx((look["runs"] - 3) * 60.0)
    assert f"{look['runs']} runs of each backend ({look['runs'] - 3} more, about" in cell["advice_said"]


def test_no_look_is_advised_below_the_floor_and_a_margin_that_would_decide_is_named():
    """A spread four times the margin (kl on the H100 study): no planned look decides it, and the advice names the
    margin twelve runs would confirm instead."""
    wide = judged([4.0 * x for x in (-1, 0.5, 1.2, -0.4, 0.8)], runs=5)
    found = advice.advise("kl", {**wide, "margin_spec": {"ratio": 1.5}})
    assert found["look"] is None and found["best"]["either"] < advice.FLOOR
    assert found["confirmable_scale"] == "ratio" and found["confirmable"] > 1.5
    assert advice.words(found).startswith("no planned look decides it")


def test_advice_followed_decides_at_the_rate_it_states():
    """benchmarks/advice_followed.py in small: studies first judged at 5 runs over its grid, pooled, the advised
    looks decide within 5 points of the chance stated (docs/verdicts.md has the full tables)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "advice_followed.py"
    spec = importlib.util.spec_from_file_location("advice_followed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = random.Random(7)
    found = [r for effect in module.EFFECTS for spread in module.SPREADS
             for r in (module.study(rng, effect, spread, 5) for _ in range(60)) if r is not None]
    stated = sum(s for s, _ in found) / len(found)
    reached = sum(d for _, d in found) / len(found)
    assert len(found) > 200 and abs(reached - stated) < 0.07, (stated, reached, len(found))
