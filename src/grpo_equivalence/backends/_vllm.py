"""What the two vLLM backends share: TRL's colocated-vLLM settings and the engine's process environment."""

import os
import time

OPTIONS = {"gpu_memory_utilization": "fraction of the GPU's memory vLLM reserves up front for weights and KV cache"}


def fraction(options: dict, default_fraction: float) -> float:
    return options.get("gpu_memory_utilization", default_fraction)


def colocate_overrides(options: dict, default_fraction: float) -> dict:
    """vLLM in the training process, reserving `gpu_memory_utilization` of the device (each library's default)."""
    return {"use_vllm": True, "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": fraction(options, default_fraction)}


def prepare_process() -> None:
    """Before vLLM is imported. The engine runs in this process: a forked engine process fails with "CUDA error:
    initialization error" once the trainer has touched CUDA. And no usage report leaves the machine. The engine's
    one-process "distributed" group listens on MASTER_PORT, by default one fixed port, which a second engine
    starting on the machine then finds taken (EADDRINUSE): each job takes a free one."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if "MASTER_PORT" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# vLLM's own message when free memory rose while it profiled (another job freed memory on the shared GPU)
PROFILING_RACE = "Error in memory profiling"
ATTEMPTS = 4


def start_engines_quietly() -> None:
    """Every vLLM engine of this process starts holding its GPU's quiet lock (grpo_equivalence.gpus.quiet): the
    engine sizes its KV cache from the device's free memory, which another job loading or ending would change."""
    from vllm.entrypoints.llm import LLM

    from .. import gpus

    if getattr(LLM.__init__, "starts_quietly", False):
        return
    original = LLM.__init__

    def init(self, *args, **kwargs):
        with gpus.quiet(measuring=True):
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    return original(self, *args, **kwargs)
                except (AssertionError, RuntimeError) as error:  # a neighbour freed memory while vLLM measured it
                    if PROFILING_RACE not in str(error) or attempt == ATTEMPTS:
                        raise
                    print(f"vLLM's memory profiling saw another job free GPU memory (attempt {attempt} of {ATTEMPTS}); "
                          f"starting the engine again", flush=True)
                    time.sleep(2.0 * attempt)

    init.starts_quietly = True
    LLM.__init__ = init
