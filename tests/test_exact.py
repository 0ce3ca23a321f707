"""The sampler judged on the logits it drew from, its numerics apart (grpo_equivalence.checks.exact): on synthetic
logits whose sampler is known, at temperature 0.1 and 1.0, in float32 and bfloat16; and the logits each CPU backend
reports are the very ones its sampler drew from."""

import pytest

from grpo_equivalence.checks import power, rollout_verdict, synthetic
from grpo_equivalence.training import faults

STUDY, TINY = synthetic.STUDY, synthetic.TINY
# Logits where the settings leave choices that a 10 % temperature error changes: at temperature 0.1 a few leading
# tokens within a few hundredths of each other (bfloat16 keeps steps of 1/32 at 5), at 1.0 of a few units
SHAPES = {"T0.1": (STUDY, 0.05, 5.0), "T1.0": (TINY, 1.0, 0.0)}
# A numerics fault: the sampler's logits computed with this many times its dtype's rounding step of error
NUMERICS_NOISE = {"float32": 2.0 ** 17, "bfloat16": 4.0}


def _check(shape: str, dtype: str, tokens: int, seed: int, fault: str | None = None, own: bool = True,
           sampler_noise: float | None = None) -> dict:
    import torch

    settings, scale, offset = SHAPES[shape]
    generator = torch.Generator().manual_seed(seed)
    truth = synthetic.logits(tokens, scale, generator) + offset
    sampler = synthetic.faulty(fault, settings) if fault else settings
    return synthetic.check(truth, sampler, dtype, generator, margin=0.1, own=own, sampler_noise=sampler_noise)


# The numerics bound on these synthetic logits, whose scale is not a model's: correct kernels' mismatch is 0.008 to
# 0.019 (0.5 to 1 rounding step of bfloat16), the numerics fault's (NUMERICS_NOISE) 0.037 to 0.08
SYNTHETIC_BOUND = 0.03


def _judged(reference: dict, candidates: dict) -> dict:
    comparisons = {"reference": rollout_verdict.own_check(reference, alpha=0.05, support_margin=0.001)}
    for name, candidate in candidates.items():
        comparisons[name] = rollout_verdict.compare(reference, candidate, alpha=0.05, support_margin=0.001,
                                                    margin_sd=0.1, numerics_bound=SYNTHETIC_BOUND)
    rollout_verdict.finalize(list(comparisons.values()), 0.05)
    return comparisons


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", ["T0.1", "T1.0"])
def test_on_its_own_logits_a_correct_sampler_is_confirmed_and_every_fault_caught(shape, dtype):
    """At the size the plan asks for (one-sample tests on the sampler's own logits), a correct sampler is equivalent
    on both tests, every sampling fault is divergent on its sampler tests and never on its numerics, and a sampler
    drawing correctly from logits computed with a larger error (the numerics fault) is correct as a sampler and
    divergent on its numerics alone."""
    probe = _check(shape, dtype, 20_000, seed=1)
    planned = power.plan(probe["own_profile"], alpha=0.05, family=3 * 8, one_sample=True)
    assert all(f["kind"] == power.DETECTABLE for f in planned["faults"].values()), planned
    tokens = min(planned["tokens"], 120_000)
    reference = _check(shape, dtype, tokens, seed=2)
    candidates = {"control": _check(shape, dtype, tokens, seed=3),
                  **{fault: _check(shape, dtype, tokens, seed=4 + i, fault=fault)
                     for i, fault in enumerate(faults.SAMPLING)},
                  "numerics": _check(shape, dtype, tokens, seed=20, sampler_noise=NUMERICS_NOISE[dtype])}
    judged = _judged(reference, candidates)
    sampler = {name: {t: c["tests"][t]["verdict"] for t in ("support", "score")} for name, c in judged.items()}
    for name in ("reference", "control", "numerics"):
        assert set(sampler[name].values()) == {"equivalent"}, (name, judged[name]["tests"])
    for fault in faults.SAMPLING:
        assert "divergent" in sampler[fault].values(), (fault, judged[fault]["tests"])
        assert judged[fault]["tests"]["numerics"]["verdict"] == "equivalent"
    assert judged["control"]["tests"]["numerics"]["verdict"] == "equivalent"
    assert judged["numerics"]["tests"]["numerics"]["verdict"] == "divergent"
    assert judged["numerics"]["verdict"] == "divergent" and judged["control"]["verdict"] == "equivalent"


@pytest.mark.slow
def test_the_trainers_logits_cannot_judge_a_cold_bfloat16_sampler_its_own_can():
    """At temperature 0.1 in bfloat16 a sampler's and a trainer's logits differ by a rounding step, and the
    settings keep only tokens within 0.069 of the top one: scored with the trainer's logits (the check of a backend
    that reports none of its own), a correct sampler is never confirmed and a 10 % hotter one is not caught; on its
    own logits the first is equivalent and the second divergent, from the same draws."""
    tokens = 60_000
    reference = _check("T0.1", "bfloat16", tokens, seed=30, sampler_noise=1.0)
    control = _check("T0.1", "bfloat16", tokens, seed=31, sampler_noise=1.0)
    hot = _check("T0.1", "bfloat16", tokens, seed=32, fault="temperature_up", sampler_noise=1.0)
    trainers = {name: {**run, "sampler_logits": None} for name, run in (("control", control), ("hot", hot))}
    by_trainer = _judged({**reference, "sampler_logits": None}, trainers)
    assert by_trainer["control"]["verdict"] != "equivalent" and by_trainer["hot"]["verdict"] != "divergent"
    own = _judged(reference, {"control": control, "hot": hot})
    assert own["control"]["verdict"] == "equivalent" and own["hot"]["verdict"] == "divergent"


def test_a_sampler_that_drops_the_weakest_token_top_p_needs_is_divergent_on_its_score():
    """vLLM 0.26's kernel as a rule (faults.drop_weakest): it never draws outside the settings' support, so only
    the score sees it, and at config.yaml's settings (temperature 0.1, min_p 0.5) it is greedy wherever two tokens
    are allowed: z far above 0."""
    reference = _check("T0.1", "bfloat16", 20_000, seed=40)
    dropping = _check("T0.1", "bfloat16", 20_000, seed=41, fault="drop_weakest")
    judged = _judged(reference, {"dropping": dropping})["dropping"]["tests"]
    assert judged["support"]["candidate_outside"] == 0 and judged["score"]["verdict"] == "divergent"
    assert judged["score"]["z"] > 10


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("settings", [STUDY, TINY], ids=["T0.1", "T1.0"])
def test_the_margins_samplers_are_what_generate_draws_from_at_those_settings(settings, dtype):
    """The score test's margin is the shift a sampler 10 % hotter (or colder) gives at each position: exact only if
    scoring.alternatives' hotter and colder samplers, and the temperature faults, are the very distributions
    transformers' generate() draws from at those settings. Its processed scores, step by step, against the check's
    filters on its raw logits: the same numbers, so a fault's score moves by its margin in expectation (what the
    H100's rows at config.yaml's sampling, temperature x1.1 at 0.8 of it, left open)."""
    import torch

    from grpo_equivalence.checks import scoring
    from grpo_equivalence.training import tiny

    tokenizer = tiny.build_tokenizer()
    model = tiny.build_model(tokenizer, hidden_size=32, num_layers=1, seed=3)
    with torch.no_grad():  # logits a few hundredths apart at temperature 0.1, as a trained model's leading tokens
        model.model.norm.weight.mul_({0.1: 0.03, 1.0: 1.0}[settings["temperature"]])
    model = model.to(getattr(torch, dtype)).eval()
    prompts = tokenizer([tokenizer.apply_chat_template([{"role": "user", "content": f"{a}+{a + 1}"}], tokenize=False,
                                                       add_generation_prompt=True) for a in range(8)],
                        return_tensors="pt", padding=True)
    margins = scoring.alternatives(settings, 0.1)
    # the temperature faults' settings (a sampler's temperature x1.1 or x0.9, as the rollout check injects them), each
    # against the margin it sits on
    for fault, margin in (("temperature_up", "hot"), ("temperature_down", "cold")):
        sampler = faults.sampler_settings(fault, settings)
        with torch.no_grad():
            out = model.generate(**prompts, do_sample=True, max_new_tokens=12, output_scores=True, output_logits=True,
                                 return_dict_in_generate=True, **{k: v for k, v in sampler.items() if v is not None})
        for scores, logits in zip(out.scores, out.logits, strict=True):
            drawn_from = torch.softmax(scores.float(), -1)
            margins_sampler = torch.softmax(scoring.filtered(margins[margin], "transformers", logits.float()), -1)
            assert torch.equal(drawn_from, margins_sampler), fault
            assert (drawn_from > 0).sum(-1).float().mean() > 1, fault  # the filters left choices to weigh


@pytest.mark.workflow
@pytest.mark.parametrize("backend", ["hf", "hf_static", "native"])
def test_the_logits_a_backend_reports_are_those_its_sampler_drew_from(backend, primed, tiny_study, monkeypatch):
    """The first of transformers' sampling warpers (the temperature's, in generate() and in the native decoder)
    receives, at every step, bit for bit the logits the backend reported for the tokens it sampled there."""
    import copy

    import torch
    from transformers.generation import logits_process

    from grpo_equivalence.training import backends, sampler_logits
    from grpo_equivalence.training.session import session

    config = copy.deepcopy(tiny_study)
    config["grpo"]["temperature"] = 0.7
    received = []
    warp = logits_process.TemperatureLogitsWarper.__call__

    def receiving(self, input_ids, scores):
        received.append(scores.detach().clone())
        return warp(self, input_ids, scores)

    monkeypatch.setattr(logits_process.TemperatureLogitsWarper, "__call__", receiving)
    with session(config, backend, 1, model_path=primed["model"], dataset=primed["dataset"], log=lambda m: None) as built:
        trainer = built.trainer
        prompts = [trainer.train_dataset[i]["prompt"] for i in range(6) for _ in range(2)]
        mechanism = backends.get(backend).sampler_logits
        with sampler_logits.recording(trainer, mechanism, {"top_k": 5}) as recorder:
            received.clear()
            completions = [list(ids) for ids in trainer._generate(prompts)[1]]
            views = recorder.take(completions)
    assert len(views) == len(prompts) and any(len(ids) > 3 for ids in completions)
    for row, (view, ids) in enumerate(zip(views, completions, strict=True)):
        assert view["tokens"].tolist() == ids
        for step in range(len(ids)):
            assert torch.equal(view["full"][step], received[step][row].float()), (backend, row, step)


@pytest.mark.parametrize("runner", ["first", "second"])
def test_a_vllm_engine_reports_raw_log_probabilities_for_the_check_and_its_own_settings_come_back(runner):
    """trl_vllm's recorder, against a stand-in for TRL's VLLMGeneration and vLLM's engine (vLLM cannot run here):
    for the check, the worker's sampler returns raw log-probabilities and each request asks for TOP of them, while it
    samples as in training (vLLM's first model runner: its top-k/top-p sampler's mode changes with it, its path was
    chosen at start; the second: FlashInfer's path, which raw log-probabilities would open, stays closed); the views
    hold each position's top tokens and the sampled one, whatever its rank; afterwards the engine's state and TRL's
    ask are as they were. A sampled token vLLM did not report is refused."""
    from types import SimpleNamespace

    from grpo_equivalence.training import sampler_logits

    inner = SimpleNamespace(logprobs_mode="processed_logprobs")
    sampler = SimpleNamespace(logprobs_mode="processed_logprobs", **(
        {"topk_topp_sampler": inner} if runner == "first" else {"use_flashinfer": True}))
    worker = SimpleNamespace(model_runner=SimpleNamespace(sampler=sampler))
    asked = []

    def generate(prompts, **kwargs):
        asked.append(vllm.logprobs)
        assert sampler.logprobs_mode == "raw_logprobs"
        assert inner.logprobs_mode == ("raw_logprobs" if runner == "first" else "processed_logprobs")
        assert getattr(sampler, "use_flashinfer", False) is False
        # two sequences of two tokens: ranked (id, logprob) lists, the sampled token among them
        ids = [[[7, 3], [4, 9, 2]], [[3, 7], [9, 4]]]
        values = [[[-0.1, -2.5], [-0.3, -1.4, -6.0]], [[-0.2, -1.8], [-0.05, -3.1]]]
        return None, [[7, 2], [3, 9]], values, ids

    llm = SimpleNamespace(collective_rpc=lambda method, args=(): [method(worker, *args)])
    vllm = SimpleNamespace(llm=llm, logprobs=0, generate=generate)
    trainer = SimpleNamespace(vllm_generation=vllm)
    with sampler_logits.recording(trainer, "vllm", {"top_k": 5}) as recorder:
        completions = trainer.vllm_generation.generate(["a", "b"])[1]
        views = recorder.take(completions)
    assert asked == [sampler_logits.TOP] and vllm.logprobs == 0 and vllm.generate is generate
    assert sampler.logprobs_mode == inner.logprobs_mode == "processed_logprobs"
    assert getattr(sampler, "use_flashinfer", True) is True
    assert views[0]["token_logit"].tolist() == pytest.approx([-0.1, -6.0])
    assert views[0]["ids"][1].tolist() == [4, 9, 2] and views[1]["top"][1].tolist() == pytest.approx([-0.05, -3.1])
    assert views[0]["tokens"].tolist() == [7, 2] and views[0]["lse"].tolist() == [0.0, 0.0]
    with pytest.raises(RuntimeError, match="no log-probability of the sampled token 5"):
        sampler_logits.view_of_logprobs([[3, 7]], [[-0.1, -2.0]], [5])


@pytest.mark.parametrize("settings", [STUDY, TINY], ids=["T0.1", "T1.0"])
def test_a_vocabulary_reported_by_its_largest_logits_is_judged_as_the_whole(settings):
    """A real vocabulary is reported by its TOP largest logits, the sampled token's and the row's log-sum-exp (vLLM
    gives no more): wherever top_k is within them, every figure the sampler test and the numerics take is the whole
    row's; with no top_k, a position where the settings could keep the rest is left unjudged, never guessed."""
    import torch

    from grpo_equivalence.checks import exact
    from grpo_equivalence.training import sampler_logits

    generator = torch.Generator().manual_seed(50)
    logits = torch.randn((400, 5000), generator=generator) * torch.linspace(0.5, 4.0, 400)[:, None]
    probabilities = torch.softmax(logits, -1)
    tokens = torch.cat([torch.multinomial(probabilities[:300], 1, generator=generator).squeeze(1),
                        torch.randint(0, 5000, (100,), generator=generator)])
    whole = [{"full": logits, "tokens": tokens}]
    top = logits.topk(sampler_logits.top_count(settings), dim=-1)
    narrowed = [{"top": top.values, "ids": top.indices, "tokens": tokens, "lse": torch.logsumexp(logits, -1),
                 "token_logit": logits.gather(1, tokens[:, None]).squeeze(1)}]
    for name, view in (("whole", whole), ("narrowed", narrowed)):
        assert exact.raw_logprobs(view).tolist() == pytest.approx(
            torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1).tolist(), abs=1e-5), name
    a = exact.score_own(whole, settings, margin=0.1, order="vllm", vocabulary=5000)
    b = exact.score_own(narrowed, settings, margin=0.1, order="vllm", vocabulary=5000)
    assert not any(b["unjudged"]) and a["outside"] == b["outside"] and a["decided"] == b["decided"]
    assert b["logq"] == pytest.approx(a["logq"], abs=1e-4) and b["hot"]["shift"] == pytest.approx(a["hot"]["shift"],
                                                                                                   abs=1e-4)
    assert any(a["outside"]) and not all(a["outside"])
    loose = {**settings, "top_k": None, "min_p": None, "top_p": 0.9}
    c = exact.score_own(narrowed, loose, margin=0.1, order="vllm", vocabulary=5000)
    assert any(c["unjudged"]) and not any(o and u for o, u in zip(c["outside"], c["unjudged"], strict=True))


@pytest.mark.parametrize("schema, own, readable", [(3, True, True), (3, False, True), (2, False, True),
                                                   (2, True, False), (1, False, False)])
def test_a_check_of_before_is_read_where_it_holds_what_todays_holds(schema, own, readable, tmp_path):
    """A schema-2 file holds what today's file of a backend reporting no logits holds: it is judged by today's tests
    (docs/performance/rollout-native-4b-rerun). One claiming its sampler's logits, or of schema 1, is refused."""
    import json

    from grpo_equivalence.analysis.stats import StatsError
    from grpo_equivalence.checks import rollout

    path = tmp_path / "hf.json"
    path.write_text(json.dumps({"schema_version": schema, "sampler_logits": "generate" if own else None,
                                "backend": "hf", "seed": 1, "sampling": {}, "completions": [], "profile": {}}))
    if readable:
        assert rollout.load(path)["backend"] == "hf"
    else:
        with pytest.raises(StatsError, match=f"written by an earlier check, schema {schema}"):
            rollout.load(path)
