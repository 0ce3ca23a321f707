"""Tests that need a CUDA GPU (marked `cuda`; skipped elsewhere, e.g. in CI)."""

import copy
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from grpo_equivalence.analysis import stats
from grpo_equivalence.runtime.memory import GB, MemoryProbe

pytestmark = pytest.mark.cuda


def test_memory_probe_resets_at_step_start_and_sees_the_steps_peak():
    import torch

    probe = MemoryProbe("cuda")
    big = torch.empty(int(2 * GB), dtype=torch.uint8, device="cuda")
    del big
    probe.reset()
    small = torch.empty(int(0.1 * GB), dtype=torch.uint8, device="cuda")
    figures = probe.read()
    assert 0.1 <= figures["peak_allocated_gb"] < 1.0  # the 2 GB before the reset does not count
    assert figures["peak_reserved_gb"] >= figures["peak_allocated_gb"]
    assert figures["device_used_gb"] >= figures["peak_reserved_gb"] * 0.99
    assert figures["peak_mem_gb"] >= figures["device_used_gb"] - 1e-9
    del small


def test_shared_adapter_inputs_compute_the_same_step_on_cuda():
    """The configurations shared_inputs and lean: on CUDA's autocast too, bit for bit the same step."""
    from helpers import assert_shared_inputs_exact

    assert_shared_inputs_exact("cuda")


def test_the_checks_session_of_a_liger_configuration_computes_with_liger_kernels(primed_bf16, tiny_study):
    """transformers applies Liger's kernels in Trainer.train(), which the rollout and trainer checks never call: the
    session applies them itself, so that `native+liger`'s checks compute with the kernels its training uses (before,
    its trainer check compared `native` with itself)."""
    pytest.importorskip("liger_kernel")
    from grpo_equivalence.training.session import session

    config = copy.deepcopy(tiny_study)
    config.update(gpus_per_train_job=1, dtype="bfloat16")
    with session(config, "native+liger", 1, model_path=primed_bf16["model"], dataset=primed_bf16["dataset"],
                 log=lambda message: None) as built:
        norms = [m for name, m in built.trainer.model.named_modules() if name.endswith("input_layernorm")]
        assert norms and all(m._get_name() == "LigerRMSNorm" for m in norms)


@pytest.fixture(scope="module")
def primed_bf16(primed, tmp_path_factory):
    """The primed tiny model saved in bfloat16, as the workflow's prime job saves it for a bfloat16 study (an
    engine that loads the checkpoint from its path, like TRL's vLLM, takes its dtype)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("primed-bf16")
    AutoModelForCausalLM.from_pretrained(primed["model"], dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(primed["model"]).save_pretrained(out)
    return {**primed, "model": str(out)}


# Each run in a process of its own, as a train job: a vLLM engine holds its memory and process group for the
# life of the process, so two engines never share one.
RUN = """
import json, sys
from pathlib import Path
from grpo_equivalence.training import train
a = json.loads(sys.argv[1])
train.run(a["config"], a["backend"], a["steps"], model_path=a["model"], dataset=a["dataset"], out=Path(a["out"]))
"""


@pytest.mark.parametrize("backend", ["hf", "cb_paged", "unsloth_fi_false", "vllm", "trl_vllm", "native"])
def test_backend_trains_on_cuda_with_kl_and_clipped_grad_norm(primed_bf16, tiny_study, tmp_path, backend):
    config = copy.deepcopy(tiny_study)
    config.update(gpus_per_train_job=1, dtype="bfloat16")
    config.setdefault("backend_options", {})[backend] = (
        {"gpu_memory_utilization": 0.25} if "vllm" in backend else config.get("backend_options", {}).get(backend, {}))
    out = tmp_path / f"grpo_{backend}_4.json"
    args = {"config": config, "backend": backend, "steps": 4, "model": primed_bf16["model"],
            "dataset": primed_bf16["dataset"], "out": str(out)}
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(args)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-8000:]
    run = stats.load(out)
    assert run["environment"]["gpu_count"] >= 1 and run["environment"]["gpu_memory_gb"] > 0
    for step in run["steps"]:
        assert step["kl"] is not None and step["grad_norm"] is not None
        assert step["peak_allocated_gb"] > 0 and step["peak_reserved_gb"] >= step["peak_allocated_gb"]
    trainer = run["effective_config"]["trainer"]
    assert trainer["max_grad_norm"] == tiny_study["grpo"]["max_grad_norm"]
    assert trainer["beta"] == tiny_study["grpo"]["beta"]
    assert trainer["use_vllm"] is ("vllm" in backend)
    assert run["startup_s"] > 0
    if "vllm" in backend:
        # The engine's reservation is in use before step 1
        assert trainer["vllm_gpu_memory_utilization"] == 0.25
        assert run["startup_memory"]["device_used_gb"] >= 0.2 * run["environment"]["gpu_memory_gb"]


def test_the_native_decoders_cuda_graphs_sample_the_eager_steps_tokens(primed):
    """The decode step compiled and replayed as CUDA graphs gives the eager step's tokens where sampling leaves no
    choice (top_k 1, float32), over two rollouts with an optimizer step between them (the graphs read the merged
    weights copied into place), for prompts of different lengths padded to the graph's bucket."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from grpo_equivalence.training.decoder import model as decoder

    tokenizer = AutoTokenizer.from_pretrained(primed["model"])
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(primed["model"]).cuda(),
                           LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=16, target_modules="all-linear"))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    prompts = [tokenizer(q, add_special_tokens=False)["input_ids"] for q in ("What is 3+4?", "12+5", "1+1+1+1+1+1")]
    generation = GenerationConfig(max_new_tokens=40, do_sample=True, top_k=1, pad_token_id=tokenizer.pad_token_id)
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
    graphs, eager = decoder.Decoder(model), decoder.Decoder(model, compiled=False)
    assert graphs.graphs and not eager.graphs
    for _ in range(2):
        assert graphs.generate(prompts, generation, eos, pad) == eager.generate(prompts, generation, eos, pad)
        with torch.no_grad():
            for parameter in (p for p in model.parameters() if p.requires_grad):
                parameter.add_(0.02)
    assert len(graphs._states) == 1 and len(next(iter(graphs._states.values())).graphs) >= 1


def test_a_run_on_two_gpus_trains_on_both(primed_bf16, tiny_study, tmp_path):
    """gpus_per_train_job: 2 on a machine with two GPUs: one process per GPU over NCCL (grpo_equivalence.training.parallel),
    every step recorded with KL and process 0's memory."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    from grpo_equivalence.training import parallel

    config = copy.deepcopy(tiny_study)
    config.update(gpus_per_train_job=2, dtype="bfloat16")
    run = parallel.launch(config, "hf", 4, model_path=primed_bf16["model"], dataset=primed_bf16["dataset"],
                          study="cuda-test", adapter=None, threads=2)
    assert run["environment"]["processes"] == 2 and [s["step"] for s in run["steps"]] == [1, 2, 3, 4]
    assert all(s["kl"] is not None and s["peak_allocated_gb"] > 0 for s in run["steps"])
