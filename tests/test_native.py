"""The project's own PyTorch decoder (grpo_equivalence.training.decoder, backend native) against transformers' generate():
the same tokens where sampling leaves no choice (top_k 1), with prompts of different lengths and LoRA adapters
that are not zero, for the tiny Qwen3 model and a Llama model built here; merged weights that follow the
trainer's; the sampler's distribution and draws; the compiled decode step; and the refusals."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

from grpo_equivalence.training.decoder import model as decoder
from grpo_equivalence.training.decoder import sampling, weights

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def with_adapters(model):
    peft = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=16, target_modules=TARGETS))
    with torch.no_grad():
        for name, parameter in peft.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return peft


def llama(tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    return LlamaForCausalLM(config)


def generate_both(model, tokenizer, prompts, **sampling):
    settings = dict(max_new_tokens=24, do_sample=True, top_k=1, top_p=0.97, min_p=0.05,
                    pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    generation = GenerationConfig(**{**settings, **sampling})
    ours = decoder.Decoder(model).generate(prompts, generation, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    width = max(map(len, prompts))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    theirs = model.generate(input_ids=ids, attention_mask=mask, generation_config=generation)[:, width:].tolist()
    eos = tokenizer.eos_token_id
    return ours, [row[:row.index(eos) + 1] if eos in row else row for row in theirs]


@pytest.fixture(scope="module")
def tiny(primed):
    tokenizer = AutoTokenizer.from_pretrained(primed["model"])
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             tokenize=False) for q in ("What is 3+4?", "12+5", "What is 100 + 23 ?")]
    return tokenizer, [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
def test_the_decoder_gives_the_tokens_of_generate_for_prompts_of_different_lengths(tiny, primed, architecture):
    tokenizer, prompts = tiny
    base = AutoModelForCausalLM.from_pretrained(primed["model"]) if architecture == "qwen3" else llama(tokenizer)
    assert base.config.model_type == architecture and len({len(p) for p in prompts}) == 3
    ours, theirs = generate_both(with_adapters(base), tokenizer, prompts)
    assert ours == theirs
    assert any(len(c) > 3 for c in ours)  # not only an immediate end


def test_merged_weights_follow_the_trainers_and_leave_them_unchanged(tiny, primed):
    tokenizer, prompts = tiny
    model = with_adapters(AutoModelForCausalLM.from_pretrained(primed["model"]))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    native = decoder.Decoder(model)
    assert native.refresh() and not native.refresh()  # merged once, then nothing changed
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name  # the merge is a copy
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).add_(0.1)  # an optimizer step, in place
    assert native.refresh()
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    expected = layer.base_layer.weight + layer.get_delta_weight("default")
    q_rows = layer.base_layer.weight.shape[0]
    assert torch.allclose(native.layers[0].qkv[:q_rows], expected)


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
def test_unmerged_adapters_read_the_trainers_tensors_where_they_lie(tiny, primed, architecture):
    """With unmerged_adapters the decoder holds no copy: every weight and adapter it reads is the trainer's own
    tensor; it gives generate()'s tokens, and after an optimizer step (in place) the step reads the new adapters
    without reading the model again."""
    tokenizer, prompts = tiny
    base = AutoModelForCausalLM.from_pretrained(primed["model"]) if architecture == "qwen3" else llama(tokenizer)
    model = with_adapters(base)
    native = decoder.Decoder(model, compiled=False, unmerged=True)
    assert native.refresh() and not native.refresh()
    owned = {p.data_ptr() for p in model.parameters()}
    layer = native.layers[0]
    held = [w for part in (*layer.qkv, layer.o, *layer.gate_up, layer.down) for w in part if torch.is_tensor(w)]
    assert len(held) == 3 * 7 and all(w.data_ptr() in owned for w in held)  # base, A and B of each, no bias
    q_proj = model.get_base_model().model.layers[0].self_attn.q_proj
    assert layer.qkv[0][2] is not None and layer.qkv[0][4] == q_proj.scaling["default"]
    generation = GenerationConfig(max_new_tokens=24, do_sample=True, top_k=1, pad_token_id=tokenizer.pad_token_id,
                                  eos_token_id=tokenizer.eos_token_id)
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = (ids != pad).long()
    for round_ in range(2):
        theirs = model.generate(input_ids=ids, attention_mask=mask, generation_config=generation)[:, width:].tolist()
        assert native.generate(prompts, generation, eos, pad) == [r[:r.index(eos[0]) + 1] if eos[0] in r else r
                                                                  for r in theirs], round_
        with torch.no_grad():
            for parameter in (p for p in model.parameters() if p.requires_grad):
                parameter.add_(0.05)  # an optimizer step, in place
        assert not native.refresh()  # nothing to read again: the step reads the same tensors


def test_unmerged_adapters_give_the_trainers_own_logits_in_bfloat16(tiny, primed):
    """In bfloat16 the merged copy rounds W + BA to bfloat16, which the trainer never does: its logits differ from
    the trainer's forward; the unmerged decoder adds each adapter as PEFT does and gives the trainer's logits bit
    for bit (the numerics test's mismatch, at the source)."""
    tokenizer, prompts = tiny
    model = with_adapters(AutoModelForCausalLM.from_pretrained(primed["model"], dtype=torch.bfloat16))
    for name, parameter in model.named_parameters():
        if "lora_" in name:
            parameter.data = parameter.data.float()  # the adapters' float32, as PEFT keeps them for training
    ids = torch.tensor([prompts[2]])
    length = ids.shape[1]
    with torch.no_grad():
        trainers = model(ids).logits[0, -1].float()
        logits = {}
        for unmerged in (False, True):
            native = decoder.Decoder(model, compiled=False, unmerged=unmerged)
            native.refresh()
            cache = [tuple(torch.zeros(1, native.kv_heads, length, native.head_dim, dtype=torch.bfloat16)
                           for _ in range(2)) for _ in native.layers]
            causal = torch.ones(length, length, dtype=torch.bool).tril()[None]
            logits[unmerged] = native.forward(ids, torch.arange(length)[None], cache, 0, causal,
                                              native.rope_tables(length, "cpu", torch.bfloat16))[0]
    assert torch.equal(logits[True], trainers)
    assert not torch.equal(logits[False], trainers)


def test_a_new_merge_is_written_in_place_one_layer_at_a_time(tiny, primed, monkeypatch):
    """After an optimizer step the merge lands in the tensors the decode step holds, one layer's fresh merge alive
    at a time (a second merged copy of the whole model was the 4B run's peak memory)."""
    import weakref

    tokenizer, prompts = tiny
    model = with_adapters(AutoModelForCausalLM.from_pretrained(primed["model"]))
    native = decoder.Decoder(model, compiled=False)
    native.refresh()
    held = [layer.qkv for layer in native.layers]
    alive, most = [], []
    merge = weights.merged_layer

    def counted(block):
        most.append(sum(ref() is not None for ref in alive))  # earlier layers' fresh merges still held
        fresh = merge(block)
        alive.append(weakref.ref(fresh.qkv))
        return fresh

    monkeypatch.setattr(weights, "merged_layer", counted)
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).add_(0.1)
    assert native.refresh()
    assert len(most) == len(native.layers) >= 2 and max(most) == 0
    assert all(layer.qkv is tensor for layer, tensor in zip(native.layers, held, strict=True))
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    rows = layer.base_layer.weight.shape[0]
    assert torch.allclose(native.layers[0].qkv[:rows], layer.base_layer.weight + layer.get_delta_weight("default"))


def test_a_weight_read_where_it_lies_is_never_written(tiny, primed):
    """Merged while the adapters were off, o_proj's weight is the trainer's own tensor; once they are on again the
    new merge takes its place (the graphs captured anew) and the trainer's weight is left as it was."""
    tokenizer, prompts = tiny
    model = with_adapters(AutoModelForCausalLM.from_pretrained(primed["model"]))
    generation = GenerationConfig(max_new_tokens=4, do_sample=True, top_k=1)
    native = decoder.Decoder(model, compiled=False)
    o_proj = model.get_base_model().model.layers[0].self_attn.o_proj
    before = o_proj.base_layer.weight.detach().clone()
    with model.disable_adapter():
        native.generate(prompts, generation, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    assert native.layers[0].o.data_ptr() == o_proj.base_layer.weight.data_ptr() and native._states
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).add_(0.1)
    assert native.refresh()
    assert torch.equal(o_proj.base_layer.weight, before)
    assert native.layers[0].o.data_ptr() != o_proj.base_layer.weight.data_ptr() and not native._states
    assert torch.allclose(native.layers[0].o, before + o_proj.get_delta_weight("default"))


def test_an_architecture_it_does_not_decode_is_refused_by_name():
    from transformers import GPT2Config

    with pytest.raises(weights.UnsupportedModel, match="this model is 'gpt2'.*use backend 'hf'"):
        weights.check_architecture(GPT2Config())


def test_a_sampling_setting_it_does_not_implement_is_refused_by_name():
    with pytest.raises(ValueError, match="repetition_penalty=1.1.*use backend 'hf'"):
        sampling.check_sampling(GenerationConfig(do_sample=True, repetition_penalty=1.1))
    sampling.check_sampling(GenerationConfig(do_sample=True, temperature=0.9, top_k=5, top_p=0.97, min_p=0.05,
                                            max_new_tokens=24))


def test_the_sampler_gives_the_warpers_distribution_over_the_whole_vocabulary():
    """Drawing among the top_k + TIES largest logits is the distribution transformers' warpers give over all of
    them, ties with the k-th logit included (bfloat16 logits tie often)."""
    from transformers.generation.logits_process import LogitsProcessorList

    generation = GenerationConfig(do_sample=True, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, max_new_tokens=4)
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(1)) * 3
    logits[0, :8] = logits[0].max() + 1  # eight tokens tie above all others, past top_k
    logits[1, 10:14] = logits[1].topk(5).values[-1]  # ties with the fifth largest
    sampler = sampling.Sampler(generation)
    probs, ids = sampler.distribution(logits)
    ours = torch.zeros_like(logits).scatter_(1, ids, probs)
    theirs = torch.softmax(LogitsProcessorList(sampling.warpers(generation))(None, logits.clone()), dim=-1)
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert (theirs[0] > 0).sum() == 8 and (theirs[1] > 0).sum() >= 1


def test_exponential_races_draw_from_the_distribution():
    sampler = sampling.Sampler(GenerationConfig(do_sample=True, top_k=0, max_new_tokens=4))
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    logits = torch.log(probs).expand(20000, 4).clone()
    draws = sampler(logits, torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=4) / len(draws)
    assert torch.allclose(counts, probs, atol=0.015) and counts[3] == 0


def test_the_compiled_decode_step_gives_the_eager_tokens_and_follows_an_optimizer_step(tiny, primed, monkeypatch):
    """The decode step compiled (torch.compile, here for the CPU: CUDA graphs are the GPU's) samples what the
    eager one does, with one compilation of each half of a layer for every layer and every attention window, and
    a merge after the first rollout lands in the tensors the step already holds."""
    monkeypatch.setattr(decoder, "WINDOW", 8)  # several windows in 16 new tokens
    tokenizer, prompts = tiny
    model = with_adapters(AutoModelForCausalLM.from_pretrained(primed["model"]))
    generation = GenerationConfig(max_new_tokens=16, do_sample=True, top_k=1, pad_token_id=tokenizer.pad_token_id,
                                  eos_token_id=tokenizer.eos_token_id)
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
    eager, compiled = decoder.Decoder(model, compiled=False), decoder.Decoder(model, compiled=True)
    unmerged = decoder.Decoder(model, compiled=True, unmerged=True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert compiled.generate(prompts, generation, eos, pad) == eager.generate(prompts, generation, eos, pad)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # each half once, whatever layer or window
    held = compiled.layers[0].qkv
    with torch.no_grad():
        for parameter in (p for p in model.parameters() if p.requires_grad):
            parameter.add_(0.05)
    after = compiled.generate(prompts, generation, eos, pad)
    assert compiled.layers[0].qkv is held and not torch.equal(held, eager.layers[0].qkv)  # copied in place
    assert after == eager.generate(prompts, generation, eos, pad)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # new weights, same compiled halves
    # unmerged (the layers' weights apart, each with its adapter): its own two halves, the same tokens
    assert unmerged.generate(prompts, generation, eos, pad) == after
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 4


def test_the_warm_up_compiles_for_the_longest_prompt_and_leaves_the_random_streams_alone(tiny, primed):
    """Before training (start-up) the decoder compiles for the data set's longest prompt at the rollout's batch
    size; the rollouts after it reuse that cache, and the warm-up draws nothing from the run's random streams."""
    from datasets import Dataset

    from grpo_equivalence.training.backends.native import longest_prompt

    tokenizer, prompts = tiny
    questions = ["What is 3+4?", "What is 100 + 23 + 7 ?", "12+5"]
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in questions])
    text = tokenizer.apply_chat_template([{"role": "user", "content": questions[1]}], add_generation_prompt=True,
                                         tokenize=False)
    assert longest_prompt(rows, tokenizer) == tokenizer(text, add_special_tokens=False)["input_ids"]
    longest = longest_prompt(rows, tokenizer)
    assert longest_prompt(Dataset.from_list([{"question": "no prompt column"}]), tokenizer) == []
    model = with_adapters(AutoModelForCausalLM.from_pretrained(primed["model"]))
    native = decoder.Decoder(model, compiled=True)
    generation = GenerationConfig(max_new_tokens=8, do_sample=True, top_k=5, pad_token_id=tokenizer.pad_token_id)
    before = torch.get_rng_state()
    assert native.warm_up(longest, 3, generation, [tokenizer.eos_token_id], tokenizer.pad_token_id) > 0
    assert torch.equal(torch.get_rng_state(), before)
    (state,) = native._states.values()
    native.generate(prompts, generation, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    assert list(native._states.values()) == [state]  # the same cache: long enough


@pytest.mark.slow
def test_the_decode_benchmark_runs_and_writes_its_figures(tmp_path):
    """benchmarks/native_decode.py as a smoke run on the CPU, on a small Qwen3 shape (its figures are the GPU's)."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    architecture = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 16, "hidden_act": "silu",
                    "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 512,
                    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
                    "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 256}
    (tmp_path / "shape.json").write_text(json.dumps(architecture))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "native_decode.py"), "--device", "cpu",
                           "--architecture", str(tmp_path / "shape.json"), "--batches", "2", "--prompt", "8",
                           "--tokens", "12", "--out", str(tmp_path / "figures.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["batches"]["2"]["native_ms"] > 0 and figures["bandwidth_floor_ms"] is None
