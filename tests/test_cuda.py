"""Tests that need a CUDA GPU (marked `cuda`; skipped elsewhere, e.g. in CI)."""

import pytest

from grpo_equivalence import stats, train
from grpo_equivalence.memory import GB, MemoryProbe

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


@pytest.mark.parametrize("backend", ["hf", "cb_paged", "unsloth_fi_false"])
def test_backend_trains_on_cuda_with_kl_and_clipped_grad_norm(primed, tiny_study, tmp_path, backend):
    import copy

    config = copy.deepcopy(tiny_study)
    config.update(gpus_per_train_job=1, dtype="bfloat16")
    out = tmp_path / f"grpo_{backend}_4.json"
    train.run(config, backend, 4, model_path=primed["model"], dataset=primed["dataset"], out=out, log=print)
    run = stats.load(out)
    assert run["environment"]["gpu_count"] >= 1
    for step in run["steps"]:
        assert step["kl"] is not None and step["grad_norm"] is not None
        assert step["peak_allocated_gb"] > 0 and step["peak_reserved_gb"] >= step["peak_allocated_gb"]
    trainer = run["effective_config"]["trainer"]
    assert trainer["max_grad_norm"] == tiny_study["grpo"]["max_grad_norm"]
    assert trainer["beta"] == tiny_study["grpo"]["beta"]
