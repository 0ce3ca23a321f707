"""What the two vLLM backends share: TRL's colocated-vLLM settings and the engine's process environment."""

import os

OPTIONS = {"gpu_memory_utilization": "fraction of the GPU's memory vLLM reserves up front for weights and KV cache"}


def fraction(options: dict, default_fraction: float) -> float:
    return options.get("gpu_memory_utilization", default_fraction)


def colocate_overrides(options: dict, default_fraction: float) -> dict:
    """vLLM in the training process, reserving `gpu_memory_utilization` of the device (each library's default)."""
    return {"use_vllm": True, "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": fraction(options, default_fraction)}


def prepare_process() -> None:
    """Before vLLM is imported. The engine runs in this process: a forked engine process fails with "CUDA error:
    initialization error" once the trainer has touched CUDA. And no usage report leaves the machine."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")


def start_engines_quietly() -> None:
    """Every vLLM engine of this process starts holding its GPU's quiet lock (grpo_equivalence.gpus.quiet): the
    engine sizes its KV cache from the device's free memory, which another job starting or ending would change."""
    from vllm.entrypoints.llm import LLM

    from .. import gpus

    if getattr(LLM.__init__, "starts_quietly", False):
        return
    original = LLM.__init__

    def init(self, *args, **kwargs):
        with gpus.quiet():
            original(self, *args, **kwargs)

    init.starts_quietly = True
    LLM.__init__ = init
