"""What the two vLLM backends share: TRL's colocated-vLLM settings and the engine's process environment."""

import contextlib
import os
import time
from pathlib import Path

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
    os.environ.setdefault("VLLM_ENABLE_STARTUP_PLAN", "1")  # start_engines_quietly: later engines skip profiling
    if "MASTER_PORT" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())


@contextlib.contextmanager
def sized_from_total_memory():
    """Around Unsloth's model load with fast_inference: Unsloth sizes the engine it starts from the device's free
    memory at that moment (gpu_memory_utilization times what is free, and from what that leaves for the KV cache
    the chunked-prefill budget and the most sequences at once), so on a shared GPU each run's engine got other
    settings, set by its neighbours (on one H200: a share of 6.3 % to 9.9 % of the GPU, a budget of 4096 or 6144
    tokens, 32 to 64 sequences), and a startup plan recorded by one fit none of the others. Here Unsloth reads the
    device's total memory as free: every run's engine has the study's share and the settings an empty device
    gives it (vLLM still checks at its start that the share is free, which the lease holds)."""
    try:
        from unsloth_zoo import vllm_utils
    except ImportError:
        yield
        return
    measured = vllm_utils.get_mem_info

    def total_as_free():
        _, total = measured()
        return total, total

    vllm_utils.get_mem_info = total_as_free
    try:
        yield
    finally:
        vllm_utils.get_mem_info = measured


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# vLLM's own message when free memory rose while it profiled (another job freed memory on the shared GPU)
PROFILING_RACE = "Error in memory profiling"
# torch.distributed's, when the port vLLM found free for its one-process group was taken before it listened: engines
# starting together race for ports (one of sixteen did so on an H200); another start finds another port
PORT_RACE = "EADDRINUSE"
ATTEMPTS = 4
# Said by an engine start that expected its settings' startup plan and found none that applies: it would profile
# beside jobs that change the device's memory, so it starts again holding the quiet lock exclusively
NO_PLAN = "no startup plan applies to this engine"


BLOCK = 16  # tokens per vLLM KV-cache block


def kv_cache_bytes(engine: dict) -> int | None:
    """What a vLLM engine of these arguments can ever hold in its KV cache: max_num_seqs sequences of max_model_len
    tokens (the model's context where not given; whole blocks), at the model's KV width and the cache's dtype; None
    where the arguments leave the number of sequences to vLLM, or the size would take more than half of the
    engine's share of the device (then vLLM sizes it as usual, measuring the device's memory)."""
    from transformers import AutoConfig

    if not engine.get("max_num_seqs") or not engine.get("model"):
        return None
    config = AutoConfig.from_pretrained(engine["model"])
    config = getattr(config, "text_config", None) or config
    # vLLM's own default context: the model's
    seqs = engine["max_num_seqs"]
    length = engine.get("max_model_len") or getattr(config, "max_position_embeddings", None)
    if not length:
        return None
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dtype = str(engine.get("kv_cache_dtype") or "auto")
    if dtype == "auto":
        dtype = str(engine.get("dtype") or "auto")
        if dtype == "auto":
            dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "bfloat16")
    width = 1 if "fp8" in dtype else 4 if "float32" in dtype else 2
    blocks = -(-int(length) // BLOCK)
    size = int(seqs) * blocks * BLOCK * config.num_hidden_layers * 2 * kv_heads * head_dim * width
    import torch

    if torch.cuda.is_available():
        share = float(engine.get("gpu_memory_utilization") or 0.9)
        if size > share * torch.cuda.get_device_properties(0).total_memory / 2:
            return None
    return size


def _startup_plans():
    """vLLM's startup-plan module and its worker module (vLLM >= 0.26), or None where this vLLM has none."""
    try:
        from vllm.v1.worker import gpu_worker, startup_plan
    except ImportError:
        return None
    needed = ("compute_plan_fingerprint", "_load_plan", "_applicable_kv_cache_memory_bytes", "maybe_apply_startup_plan")
    if not all(hasattr(startup_plan, name) for name in needed) or not hasattr(gpu_worker, "maybe_apply_startup_plan") \
            or not hasattr(getattr(gpu_worker, "Worker", None), "init_device"):
        return None
    return startup_plan, gpu_worker


def _plan_recorded() -> bool:
    """Whether an engine of this compile-cache folder (VLLM_CACHE_ROOT: keyed by code and settings) recorded its
    startup plan."""
    import vllm.envs as envs

    return any((Path(envs.VLLM_CACHE_ROOT) / "startup_plan").glob("startup_plan_*.json"))


def start_engines_quietly() -> None:
    """Every vLLM engine of this process starts holding its GPU's quiet lock (grpo_equivalence.runtime.quietlock.quiet): the
    engine sizes its KV cache from the device's free memory, which another job loading or ending would change.

    Only an engine that measures needs the lock exclusively. The first engine of a study's settings profiles, and
    vLLM's startup plan (VLLM_ENABLE_STARTUP_PLAN) records the KV-cache size it arrived at beside the compile
    cache; every later engine of those settings applies it and skips the profiling, so it only allocates, as a
    model load does, and takes the lock shared. An engine whose settings have no plan (found before the worker's
    memory snapshot) holds the lock exclusively from there; one that finds out only later starts again. On a
    shared GPU the plan applies whatever the device's free memory is now: vLLM's own gate (no less free memory
    than when the plan was recorded) assumes a device with no neighbours, and the lease already holds this job's
    share (vLLM checks at start that its share is free). An engine that finds no plan recorded waits, holding no
    lock of the GPU, while another engine of its compile-cache folder measures (_measured_once): with a dozen
    packed runs starting at once, each of them would otherwise measure in turn, and every job beside them wait
    to load or to end.

    In a study whose jobs share GPUs (quietlock.SIZED_ENV) no engine measures at all where its arguments bound what its
    KV cache can ever hold (kv_cache_bytes): it is told that size (vLLM's kv_cache_memory_bytes, which skips the
    profiling of memory) and starts holding the lock shared. On one H200, twelve packed seeds of six backends
    still spent their first five minutes so: the first engine of the vllm settings waited 190 s for the loads
    beside it to let it measure, and the engines of that setting 270 s for its measurement. Every run of such a
    study gets the same KV cache, whatever ran beside it."""
    from vllm.entrypoints.llm import LLM

    from ...runtime import quietlock

    if getattr(LLM.__init__, "starts_quietly", False):
        return
    original = LLM.__init__
    plans = []

    def init(self, *args, **kwargs):
        sized = os.environ.get(quietlock.SIZED_ENV) and "kv_cache_memory_bytes" not in kwargs and kv_cache_bytes(kwargs)
        if sized:  # nothing to measure: the start only allocates, as a model load does
            return _started(lambda: original(self, *args, **{**kwargs, "kv_cache_memory_bytes": sized}), None)
        if not plans:  # vLLM's worker modules are imported by now (the engine imports them anyway)
            plans.append(_startup_plans())
            if plans[0] is not None:
                _follow_plans(*plans[0])
        with _measured_once(plans[0] is not None):
            return _started(lambda: original(self, *args, **kwargs), plans[0] is None or not _plan_recorded())

    init.starts_quietly = True
    LLM.__init__ = init


def _started(start, measuring: bool | None):
    """An engine start (`start()`), holding the GPU's quiet lock, exclusively where it measures; again where it lost a
    race: its port to another engine starting (PORT_RACE), or, where it may measure (`measuring` not None), the
    device's memory to a neighbour (PROFILING_RACE, NO_PLAN: then again alone, measuring)."""
    from ...runtime import quietlock

    for attempt in range(1, ATTEMPTS + 1):
        with quietlock.quiet(measuring=bool(measuring)):
            try:
                return start()
            except (AssertionError, RuntimeError) as error:  # vLLM's own assertion, or torch.distributed's
                said = str(error)
                port = PORT_RACE in said
                if not (port or measuring is not None and (PROFILING_RACE in said or NO_PLAN in said)) \
                        or attempt == ATTEMPTS:
                    raise
                what = "lost its port to another engine" if port else "must measure the GPU's memory"
                print(f"vLLM's engine start {what} ({said.splitlines()[0][:120]}; attempt {attempt} of {ATTEMPTS}); "
                      f"starting it again{'' if port else ' alone'}", flush=True)
        _free_failed_start()
        if port:
            os.environ["MASTER_PORT"] = str(free_port())
        else:
            measuring = True
        time.sleep(2.0 * attempt)


MEASURING = ".measuring.lock"  # beside the startup plans: held by the engine of a folder that measures


@contextlib.contextmanager
def _measured_once(plans: bool):
    """Around an engine start: where this vLLM records startup plans (`plans`) and none is recorded in this
    compile-cache folder yet, holds the folder's measuring lock, after waiting for the engine that holds it; an
    engine that then finds a plan recorded lets it go and applies the plan. Takes no lock of the GPU, so that the
    engine measuring is not kept waiting by the ones waiting here. An engine that dies lets its lock go with it,
    and the next one measures instead."""
    import fcntl

    if not plans or _plan_recorded():
        yield
        return
    import vllm.envs as envs

    folder = Path(envs.VLLM_CACHE_ROOT) / "startup_plan"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / MEASURING, "a") as handle:
        began = time.monotonic()
        fcntl.flock(handle, fcntl.LOCK_EX)
        if _plan_recorded():
            handle.close()
            print(f"waited {time.monotonic() - began:.0f} s for the first vLLM engine of these settings to measure "
                  f"the GPU's memory", flush=True)
        yield


def _free_failed_start() -> None:
    """What a failed engine start left allocated (its weights, its buffers) goes before the next start measures."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _follow_plans(startup_plan, gpu_worker) -> None:
    from ...runtime import quietlock

    recorded_gate = startup_plan._applicable_kv_cache_memory_bytes
    apply = gpu_worker.maybe_apply_startup_plan

    def applicable(plan, current_free_memory):
        if not quietlock.quiet_paths():  # no lease beside it: vLLM's own gate
            return recorded_gate(plan, current_free_memory)
        kv_bytes = plan.get("kv_cache_memory_bytes")
        return kv_bytes if isinstance(kv_bytes, int) and kv_bytes > 0 else None

    def apply_or_stop(worker):
        apply(worker)
        if worker.cache_config.kv_cache_memory_bytes is None and quietlock.quiet_held() == "shared":
            raise RuntimeError(f"{NO_PLAN} (settings other than the recorded plan's)")

    init_device = gpu_worker.Worker.init_device

    def init_device_measuring_if_planless(worker, *args, **kwargs):
        # Before the worker's memory snapshot: an engine of settings with no plan profiles, so it must be alone
        fingerprint = startup_plan.compute_plan_fingerprint(worker.vllm_config, worker.rank,
                                                            worker.parallel_config.world_size)
        if quietlock.quiet_held() == "shared" and worker.cache_config.kv_cache_memory_bytes is None and \
                startup_plan._load_plan(fingerprint) is None:
            quietlock.measure_from_here()
        return init_device(worker, *args, **kwargs)

    startup_plan._applicable_kv_cache_memory_bytes = applicable
    gpu_worker.maybe_apply_startup_plan = apply_or_stop
    gpu_worker.Worker.init_device = init_device_measuring_if_planless
