"""One run in a few figures: train wall time, median step after warm-up and where its time goes, start-up,
memory, GRPO's signal and the sampler/trainer mismatch."""

import math
import statistics

from . import stats as stats_io
from .stats import StatsError

DEFAULT_SKIP = 3  # steps 1..3 compile kernels, capture graphs and grow allocators
CUDA_MEMORY = ("peak_allocated_gb", "peak_reserved_gb", "device_used_gb")  # per-step keys on CUDA only


def summarise(stats: dict, skip: int = DEFAULT_SKIP) -> dict:
    """Median step wall over steps skip+1..N: the steady state that a longer run would see."""
    timed = [s["wall_s"] for s in stats["steps"] if s["step"] > skip]
    if not timed:
        raise StatsError(f"{stats['backend']} x {stats['max_steps']}: {len(stats['steps'])} step(s) leave none after "
                         f"skipping {skip} warm-up step(s); train longer or skip fewer")
    if any(w is None or not math.isfinite(w) for w in timed):
        raise StatsError(f"{stats['backend']} x {stats['max_steps']}: a step's wall_s is missing or not finite")
    return {
        "backend": stats["backend"],
        "max_steps": stats["max_steps"],
        "steps_recorded": len(stats["steps"]),
        "train_wall_s": stats["train_wall_s"],
        "median_step_s": statistics.median(timed),
        "median_over_steps": [skip + 1, stats["steps"][-1]["step"]],
        "peak_mem_gb": stats["peak_mem_gb"],
        # GRPO learns only from groups whose rewards differ: steps where some group did (null: not logged)
        "steps_with_reward_signal": _steps_with_signal(stats["steps"]),
        # CUDA only (null elsewhere): the allocator's peaks and the driver's figure, largest over the steps
        **{key: _largest(stats["steps"], key) for key in CUDA_MEMORY},
        # Before step 1 (optional in the contract; null: not recorded): imports, load, engine start, set-up
        "startup_s": stats.get("startup_s"),
        "warmup_s": sum(s["wall_s"] for s in stats["steps"] if s["step"] <= skip),
        "uses_vllm": bool(_trainer(stats).get("use_vllm")),
        "vllm_reserved_gb": _vllm_reservation_gb(stats),
        # How far the sampler's log-probabilities are from the trainer's (TRL logs it for vLLM rollouts with
        # importance-sampling correction on): mean over the steps that logged it; absent: not logged
        "sampler_mismatch": _means(stats["steps"], MISMATCH_PREFIXES),
        # Where a step's time goes (medians over the timed steps; null where TRL's timings were not recorded)
        **_time_split(stats, [s for s in stats["steps"] if s["step"] > skip]),
        # The least a decode step can take: every weight read once at the memory bandwidth measured on the
        # run's GPU (null: not recorded, e.g. on the CPU)
        "bandwidth_floor_ms": _bandwidth_floor_ms(stats),
        # Whether the run had its GPU to itself (null: a CPU run, or not recorded): runs that shared one slowed
        # each other, and the driver's memory figure is the whole device's, so their speed and memory are not used
        "gpu_alone": alone_on_gpu(stats),
        "gpu_shared_with": ((stats.get("environment") or {}).get("gpu_lease") or {}).get("shared_with"),
    }


def step_speed(runs: list[dict], skip: int = DEFAULT_SKIP, reference: dict | None = None) -> dict | None:
    """The speed a report ranks backends by, one basis everywhere: the median step of each run that had its device
    to itself (its GPU; on the CPU every run, run beside others), their median, lowest and highest; against the
    reference's (its step_speed), its median step over this one's in % (above 100 faster), and whether the two can
    be ranked: not where their ranges overlap ("too noisy"), nor with one run of either ("spread not measured").
    None where no run had its device alone."""
    medians, cpu = [], False
    for run in runs:
        try:
            found = summarise(run, skip)
        except StatsError:  # a run too short to time: no speed from it
            continue
        cpu = cpu or not (run.get("environment") or {}).get("gpu_count")
        if found.get("gpu_alone") is not False:
            medians.append(found["median_step_s"])
    if not medians:
        return None
    out = {"median": statistics.median(medians), "low": min(medians), "high": max(medians), "runs": len(medians),
           "cpu": cpu}
    if reference:
        out["pct_of_reference"] = 100 * reference["median"] / out["median"]
        if min(out["runs"], reference["runs"]) < 2:
            out["rank"] = "one run alone: spread not measured"
        elif out["low"] <= reference["high"] and reference["low"] <= out["high"]:
            out["rank"] = "too noisy to rank"
        else:
            out["rank"] = "faster" if out["median"] < reference["median"] else "slower"
    return out


def alone_on_gpu(stats: dict) -> bool | None:
    """True where the run had its GPU(s) to itself: a lease that recorded no other job, a lease from before jobs
    could share a GPU (they could not), or a SLURM allocation; False where another job shared one; None on the
    CPU or where nothing was recorded."""
    lease = (stats.get("environment") or {}).get("gpu_lease") or {}
    if lease.get("source") not in ("lease", "slurm"):
        return None
    shared = lease.get("shared_with")
    return True if shared is None and "shared_with" not in lease or shared == [] else (False if shared else None)


# TRL's profiling blocks (stats.PROFILE) that generate completions (the native backend's under a name of its own),
# and the one that loads the trained weights into a vLLM engine before generating.
ROLLOUT_BLOCKS = (".vLLM.generate", ".transformers.generate", ".transformers.generate_batch", ".native.generate")
WEIGHT_SYNC_BLOCKS = (".sync_weights",)


def _time_split(stats: dict, steps: list[dict]) -> dict:
    """Median rollout, weight-sync and remaining (training: log-probs, loss, backward, optimizer) seconds of a
    step, rollout tokens per second, and milliseconds per decode step (rollout time over the longest
    completion's length: batched decoding takes one step per token of the longest)."""
    keys = ("median_rollout_s", "median_weight_sync_s", "median_training_s", "rollout_tokens_per_s",
            "decode_ms_per_step")
    if not steps or any(stats_io.PROFILE not in s for s in steps):
        return dict.fromkeys(keys)
    trainer = _trainer(stats)
    completions = (trainer.get("per_device_train_batch_size") or 0) * (trainer.get("gradient_accumulation_steps") or 1)
    rollout, sync, training, tokens_per_s, decode_ms = [], [], [], [], []
    for step in steps:
        blocks = step[stats_io.PROFILE]
        r = sum(v for name, v in blocks.items() if name.endswith(ROLLOUT_BLOCKS))
        w = sum(v for name, v in blocks.items() if name.endswith(WEIGHT_SYNC_BLOCKS))
        rollout.append(r)
        sync.append(w)
        training.append(step["wall_s"] - r - w)
        metrics = step.get("metrics") or {}
        if r > 0 and completions and metrics.get("completions/mean_length") is not None:
            tokens_per_s.append(metrics["completions/mean_length"] * completions / r)
        if r > 0 and metrics.get("completions/max_length"):
            decode_ms.append(1000 * r / metrics["completions/max_length"])
    median = lambda values: statistics.median(values) if values else None  # noqa: E731
    if not any(rollout):  # no generation block timed: the step cannot be split, and is not all training
        return dict.fromkeys(keys)
    return dict(zip(keys, (median(rollout), median(sync), median(training), median(tokens_per_s), median(decode_ms)),
                    strict=True))


# TRL's keys of the sampler/trainer mismatch: sampling/sampling_logp_difference/{mean,max} and
# sampling/importance_sampling_ratio/{min,mean,max}
MISMATCH_PREFIXES = ("sampling/sampling_logp_difference/", "sampling/importance_sampling_ratio/")


def _means(steps: list[dict], prefixes) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for step in steps:
        for key, value in (step.get("metrics") or {}).items():
            if key.startswith(prefixes) and isinstance(value, (int, float)) and math.isfinite(value):
                values.setdefault(key, []).append(value)
    return {key: statistics.fmean(v) for key, v in sorted(values.items())}


def _bandwidth_floor_ms(stats: dict) -> float | None:
    weights = stats.get("model_bytes")
    bandwidth = (stats.get("environment") or {}).get("memory_bandwidth_gbs")
    if not weights or not bandwidth:
        return None
    return 1000 * weights / (bandwidth * 1e9)


def _trainer(stats: dict) -> dict:
    return (stats.get("effective_config") or {}).get("trainer") or {}


def _vllm_reservation_gb(stats: dict) -> float | None:
    """What vLLM takes at start (gpu_memory_utilization x the device's memory), for weights and KV cache.

    It is in use from the first step to the last whatever the model's size: without it, the peak of a
    vLLM run reads like a leak. Null where vLLM is not used or the device's memory was not recorded.
    """
    fraction = _trainer(stats).get("vllm_gpu_memory_utilization")
    total = (stats.get("environment") or {}).get("gpu_memory_gb")
    if not _trainer(stats).get("use_vllm") or fraction is None or total is None:
        return None
    return fraction * total


def _largest(steps: list[dict], key: str) -> float | None:
    values = [s[key] for s in steps if s.get(key) is not None]
    return max(values) if values else None


def _steps_with_signal(steps: list[dict]) -> int | None:
    fractions = [s.get("metrics", {}).get("frac_reward_zero_std") for s in steps]
    if any(f is None for f in fractions):
        return None
    return sum(f < 1 for f in fractions)
