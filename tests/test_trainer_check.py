"""The trainer check: each stack's trainer at fixed weights on one saved batch, and the verdict that names where two
stacks part. On the CPU the stacks are TRL + PEFT's (hf, cb_paged); the faults show it finds the right quantity."""

import copy
import json

import pytest
import torch

from grpo_equivalence.checks import trainer, trainer_verdict


def test_a_lora_parameters_key_is_the_same_whatever_wraps_the_model():
    assert trainer.module_key("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") == \
        "layers.0.self_attn.q_proj.lora_A"
    assert trainer.module_key("model.layers.11.mlp.down_proj.lora_B.weight") == "layers.11.mlp.down_proj.lora_B"
    assert trainer.module_key("model.embed_tokens.weight") is None


def test_the_adapter_is_set_from_the_seed_and_the_name_not_zero_and_not_another_trainable(primed, tiny_study):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    def adapted(init_seed):
        torch.manual_seed(init_seed)  # PEFT's own draw differs: set_adapter overrides it
        model = AutoModelForCausalLM.from_pretrained(primed["model"], dtype=torch.float32)
        return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **tiny_study["lora"]))

    one, two = adapted(1), adapted(2)
    a, b = trainer.set_adapter(one, 3407), trainer.set_adapter(two, 3407)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(a[k].abs().sum() > 0 for k in a if k.endswith("lora_B"))  # PEFT's B is zero: the KL would vanish
    assert not torch.equal(trainer.set_adapter(two, 1)[next(iter(a))], a[next(iter(a))])
    next(p for n, p in one.named_parameters() if "embed" in n).requires_grad_(True)
    with pytest.raises(ValueError, match="is not a LoRA matrix"):
        trainer.set_adapter(one, 3407)


def synthetic(loss=-0.015, kl_term=5e-6, gradient=1.0, scaling=2.0, tokens=84, lr=5e-4):
    check = {"backend": "b", "dtype": "float32", "loss": loss, "kl_term": kl_term, "clip_coefficient": 1.0,
             "trainable": {"layers.0.q.lora_A": [8, 64]}, "trainable_numel": 512, "lora_scaling": [scaling],
             "optimizer": {"groups": [{"lr": lr, "weight_decay": 0.0, "eps": 1e-8, "betas": [0.9, 0.99],
                                       "numel": 512}]}, "schedule": [[lr], [lr / 2]], "beta": 0.001,
             "normaliser": 0.1 * tokens / loss, "tokens": tokens, "completions": 8, "grad_norm": gradient,
             "max_grad_norm": 1.0, "lengths": [tokens // 8] * 7 + [tokens - 7 * (tokens // 8)], "loss_type": "dapo"}
    g = torch.linspace(-1, 1, 512) * gradient
    tensors = {"policy_logps": torch.linspace(-3, -1, tokens), "reference_logps": torch.linspace(-3, -1.1, tokens),
               "kl": torch.full((tokens,), 0.005), "advantages": torch.tensor([1.0, -1.0] * 4),
               "gradient": {"layers.0.q.lora_A": g}, "update": {"layers.0.q.lora_A": torch.sign(g) * lr}}
    return check, tensors


def with_noise(pair, scale):
    check, tensors = copy.deepcopy(pair)
    check["dtype"] = "bfloat16"
    check["loss"] *= 1 + scale
    check["kl_term"] *= 1 + 10 * scale
    for key in ("policy_logps", "reference_logps", "kl"):
        tensors[key] = tensors[key] * (1 + scale)
    tensors["gradient"] = {k: v * (1 + scale) for k, v in tensors["gradient"].items()}
    return check, tensors


@pytest.mark.parametrize("change, first, said", [
    (dict(loss=-0.03, kl_term=1e-5), "loss", "both its terms (policy 2x, KL 2x)"),
    (dict(kl_term=5e-15), "kl_term", "KL term of the loss 1e-09x the reference's"),
    (dict(loss=-0.015 * 1.3), "policy_term", "policy term of the loss 1.3x"),
    (dict(gradient=1.77), "gradient", "gradient 1.77x the reference's norm, cosine 1.0000"),
    (dict(scaling=4.0), "lora_scaling", "scaling [4.0] against [2.0]"),
    (dict(lr=1e-4), "update", "optimizer update 0.2x the reference's norm, cosine 1.0000 (lowest 1.0000, "
                              "layers.0.q); and optimizer groups differ: [{'lr': 0.0001,"),  # the cause said with it
    ({}, None, "every quantity within its floor"),
])
def test_the_verdict_names_the_first_quantity_beyond_the_precisions_floor(change, first, said):
    reference = synthetic()
    control = with_noise(reference, 1e-3)
    result = trainer_verdict.compare(reference, synthetic(**change), control)
    assert result["first"] == first and said in result["said"], result["said"]


# A batch whose groups' completions are equally long: at ratio 1 the policy term is zero, and each stack's is its own
# rounding (here 1e-12 against a KL term of 5e-6; the control's closer to the reference's than the candidate's)
@pytest.mark.parametrize("change, first, said", [
    (dict(loss=5e-15 + 3e-12, kl_term=5e-15), "kl_term", "KL term of the loss 1e-09x the reference's"),
    (dict(loss=2 * (5e-6 + 1e-12), kl_term=1e-5), "loss", "both its terms (policy 2x, KL 2x)"),  # normalised by half
    (dict(loss=5e-6 + 3e-12), None, "every quantity within its floor"),  # rounding alone
])
def test_a_policy_term_that_cancels_to_zero_is_not_judged_on_its_own_rounding(change, first, said):
    reference = synthetic(loss=5e-6 + 1e-12)
    control = with_noise(reference, 1e-3)
    control[0]["loss"] = control[0]["kl_term"] + 1.1e-12
    result = trainer_verdict.compare(reference, synthetic(**change), control)
    assert result["first"] == first and said in result["said"], result["said"]
    assert trainer_verdict.compare(reference, control, control)["first"] is None  # the control at its own floor


def test_a_scalars_floor_is_at_least_what_the_per_token_floor_can_move_it_by():
    """The control's KL term drew near its reference's (its per-token errors cancel in the sum): a correct stack whose
    per-token KL errs within the per-token floor, in one direction, moves the KL term more than twice that draw and
    is not flagged; a KL term dropped from the loss, or the loss doubled, still is."""
    reference = synthetic()
    check, tensors = copy.deepcopy(reference)
    signs = torch.tensor([1.0, -1.0] * 42)
    control = (dict(check, dtype="bfloat16", kl_term=check["kl_term"] * (1 + 1e-5)),
               dict(tensors, kl=tensors["kl"] * (1 + 0.01 * signs)))  # per-token floor 1 %, cancelling: 0 in the sum
    moved = synthetic(kl_term=5e-6 * 1.01, loss=-0.015 + 5e-6 * 0.01)  # each token's KL 1 % up: within the floor
    moved[1]["kl"] = tensors["kl"] * 1.01
    result = trainer_verdict.compare(reference, moved, control)
    # beyond twice the single draw
    assert result["quantities"]["kl_term"]["difference"] > 2 * abs(control[0]["kl_term"] / check["kl_term"] - 1)
    assert result["quantities"]["kl_term"]["floor"] == pytest.approx(0.01, rel=1e-5)  # w.|d| / w.kl
    assert result["first"] is None, result["said"]
    dropped = synthetic(kl_term=5e-15, loss=-0.015 - 5e-6)  # the KL term gone from the loss, its policy term kept
    assert trainer_verdict.compare(reference, dropped, control)["first"] == "kl_term"
    assert trainer_verdict.compare(reference, synthetic(loss=-0.03, kl_term=1e-5), control)["first"] == "loss"
    # grpo weights each completion's tokens by one over its length: the reach follows the loss's own weights
    # (seven completions of 2 tokens and one of 70; the control's KL 1 % off on the short ones only)
    short = (dict(control[0]), dict(control[1], kl=tensors["kl"] * torch.tensor([1.01] * 14 + [1.0] * 70)))
    reference[0]["lengths"] = [2] * 7 + [70]
    assert trainer_verdict.compare(reference, moved, short)["quantities"]["kl_term"]["floor"] == \
        pytest.approx(14 / 84 * 0.01, rel=1e-4)  # dapo: every token alike
    reference[0]["loss_type"] = "grpo"
    assert trainer_verdict._kl_weights(reference[0]["lengths"], "grpo")[:2].tolist() == [0.5, 0.5]
    assert trainer_verdict.compare(reference, moved, short)["quantities"]["kl_term"]["floor"] == \
        pytest.approx(7 / 8 * 0.01, rel=1e-4)  # grpo: each completion's mean, so the short ones weigh 7 of 8


def test_the_clip_coefficients_floor_is_the_gradients_where_a_stack_clips():
    reference = synthetic(gradient=2.0)
    reference[0]["clip_coefficient"] = 0.5
    control = with_noise(reference, 1e-3)  # the gradient 0.1 % larger: clip coefficient 0.1 % smaller
    control[0]["clip_coefficient"] = 0.5  # ...but its single draw happens to be exact
    candidate = synthetic(gradient=2.0 * (1 + 1.5e-3))
    candidate[0]["clip_coefficient"] = 0.5 / (1 + 1.5e-3)
    result = trainer_verdict.compare(reference, candidate, control)
    assert result["quantities"]["clipping"]["floor"] == pytest.approx(1e-3, rel=1e-3)
    assert result["first"] is None, result["said"]
    candidate[0]["clip_coefficient"] = 0.25  # clipped at another norm than its gradient's: still flagged
    assert trainer_verdict.compare(reference, candidate, control)["first"] == "clipping"


def test_a_batch_whose_groups_all_tie_has_no_policy_term_and_the_verdict_says_zero_in_both():
    rewards = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, float("nan")], [2.0, float("nan")]])
    assert trainer._groups_with_signal(rewards, 2) == 1  # the second group's totals differ (nan: not scored)
    assert trainer._groups_with_signal(rewards[:2], 2) == 0
    assert trainer._groups_with_signal(rewards, 2, torch.tensor([1.0, 0.0])) == 1  # weighted as TRL sums them
    assert trainer._groups_with_signal(rewards[2:], 2, torch.tensor([0.0, 1.0])) == 0  # a zero weight: no signal
    reference = synthetic(loss=5e-6, kl_term=5e-6)  # the loss is its KL term: no advantage anywhere
    result = trainer_verdict.compare(reference, synthetic(loss=5.5e-6, kl_term=5.5e-6), with_noise(reference, 1e-3))
    assert result["first"] == "kl_term" and "its policy term zero in both" in result["said"], result["said"]


@pytest.fixture(scope="module")
def checked(primed, tiny_study, tmp_path_factory):
    """The trainer check on the CPU, as the workflow runs it: hf samples the batch; hf, the two trainer-side faults
    and the control (hf in bfloat16) each check it (the other rollout paths in test_workflow's shared run)."""
    folder = tmp_path_factory.mktemp("trainer")
    config = copy.deepcopy(tiny_study)
    batch = trainer.sample_batch(config, "hf", model_path=primed["model"], dataset=primed["dataset"],
                                 out=folder / "batch.json", log=lambda s: None)
    out = {}
    for name, backend, dtype in (("hf", "hf", "float32"), ("control", "hf", "bfloat16"),
                                 ("no_kl", "hf+no_kl", "float32"), ("loss_x2", "hf+loss_x2", "float32")):
        trainer.check({**config, "dtype": dtype}, backend, model_path=primed["model"], dataset=primed["dataset"],
                      batch=batch, max_steps=12, out=folder / f"{name}.json", tensors=folder / f"{name}.pt",
                      log=lambda s: None)
        out[name] = (json.loads((folder / f"{name}.json").read_text()), torch.load(folder / f"{name}.pt"))
    return batch, out


def test_the_batch_is_one_generation_batch_with_each_reward_functions_scores(checked):
    batch, _ = checked
    assert len(batch["completion_ids"]) == batch["prompts"] * batch["generations"] == 8
    assert len(batch["rewards"]) == 8 and len(batch["rewards"][0]) == 4  # the study's four reward functions
    assert batch["groups_with_signal"] >= 1  # some completions have an advantage: the policy term is compared


def test_a_batch_whose_groups_all_tie_is_sampled_again_from_the_next_prompts(primed, tiny_study, tmp_path,
                                                                             monkeypatch):
    seen = []

    def ties_first(rewards, generations, weights=None):
        seen.append(rewards.shape)
        return 0 if len(seen) == 1 else 1

    monkeypatch.setattr(trainer, "_groups_with_signal", ties_first)
    batch = trainer.sample_batch(copy.deepcopy(tiny_study), "hf", model_path=primed["model"],
                                 dataset=primed["dataset"], out=tmp_path / "batch.json", log=lambda s: None)
    assert len(seen) == 2 and batch["first_prompt"] == batch["prompts"] == 2  # the second window of prompts
    assert json.loads((tmp_path / "batch.json").read_text())["first_prompt"] == 2


def test_each_stack_computes_from_the_saved_batch_what_one_step_does(checked):
    batch, out = checked
    check, tensors = out["hf"]
    assert check["tokens"] == sum(map(len, batch["completion_ids"])) == tensors["kl"].numel()
    assert check["kl_mean"] > 1e-4  # the adapter moved the policy: the KL term is not zero
    assert check["logged"]["kl"] == pytest.approx(check["kl_mean"], rel=1e-4)  # TRL's KL is the one computed here
    assert check["normaliser"] == pytest.approx(check["tokens"], rel=1e-3)  # dapo: the loss over the batch's tokens
    assert check["grad_norm"] > 0 and check["lora_scaling"] == [2.0] and len(check["schedule"]) == 12
    assert check["with_advantage"] == int((tensors["advantages"] != 0).sum()) > 0
    assert set(tensors["gradient"]) == set(check["trainable"]) and all(v.abs().sum() > 0 for v in tensors["update"].values())


@pytest.mark.parametrize("candidate, first, said", [
    ("no_kl", "kl_term", "KL term of the loss 1e-09x"),
    ("loss_x2", "loss", "normalised by {half:.4g} where the reference by {tokens}"),  # the loss over half the tokens
    ("control", None, "every quantity within its floor"),
])
def test_a_trainer_side_fault_is_flagged_at_its_quantity_and_the_control_nowhere(
        checked, candidate, first, said):
    _, out = checked
    result = trainer_verdict.compare(out["hf"], out[candidate], out["control"])
    tokens = out["hf"][0]["tokens"]
    assert result["first"] == first and said.format(half=tokens / 2, tokens=tokens) in result["said"], result["said"]


def _trainer_section_text(comparisons) -> str:
    from grpo_equivalence.report import render, sections

    return render.environment().get_template("sections/trainer.md.j2").render(trainer=sections.trainer_section(comparisons))


@pytest.mark.parametrize("with_advantage", [0, 8])
def test_the_report_says_how_many_completions_carry_an_advantage_and_in_bold_when_none(with_advantage):
    reference = synthetic()
    reference[0]["with_advantage"] = with_advantage
    text = _trainer_section_text([trainer_verdict.compare(reference, synthetic(), with_noise(reference, 1e-3))])
    assert f"84 completion\ntokens, {with_advantage} with an advantage)" in text
    assert ("**No completion of the batch has an advantage**" in text) == (with_advantage == 0)
