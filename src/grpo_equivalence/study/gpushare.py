"""What a train or rollout-check job asks of a GPU (gpus.Need): a whole GPU, or a share of one beside other jobs.

A tiny-study run uses about 1 GB of a 141 GB H200 and a fraction of its cores, so one job per GPU leaves the
study waiting on a machine that idles. With `gpu_sharing.jobs_per_gpu` above 1 the lease packs jobs onto a GPU
within its memory: each job asks for what it needs, the vLLM backends their `gpu_memory_utilization` share
(reserved up front) and every backend what its earlier runs of the study used (or `gpu_sharing.memory_gb`).
A backend that has not run yet takes a GPU of its own, and so measures it. Packed runs slow each other: the
study's seed of each backend (the run the report's speed and memory come from) runs alone before or after the
others (`gpu_sharing.speed_runs`), and every run records which runs shared its GPU (gpu_lease.shared_with).
Nothing of another job reaches a run's numbers: each trains in its own process, from its own seed.
"""

import contextlib
import json
import math
import os
from pathlib import Path

from ..analysis import stats
from ..analysis.summary import alone_on_gpu
from ..runtime import gpus, leasefolder, paths, quietlock
from ..training import backends, faults
from .config import with_defaults

CONTEXT_GB = 1.0  # CUDA context, kernels and libraries' workspaces: outside the allocator's figures
MARGIN = 1.25  # a run's memory varies with its completions' lengths
STATS_DIR = Path(paths.STATS).parent


def packs(config: dict) -> bool:
    """Whether the study puts several jobs on one GPU."""
    return config["gpus_per_train_job"] > 0 and with_defaults("gpu_sharing", config.get("gpu_sharing"))["jobs_per_gpu"] > 1


def _runs_of(backend: str, folder: Path):
    for path in sorted(Path(folder).glob("grpo_*.json")):
        match = stats.STATS_NAME.match(path.name)
        if not match or match["backend"] != backend:
            continue
        try:
            yield json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a damaged file is the report's to refuse, not a reason to fail a lease


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def own_memory_gb(run: dict) -> float | None:
    """The device memory one run used itself, beside its vLLM reservation (GB). Alone on its GPU, the driver's
    figure (context included); beside other jobs that figure is theirs too, so the allocator's peak plus a
    context."""
    steps = run.get("steps") or []
    if alone_on_gpu(run):
        figures = [_number(s.get("peak_mem_gb")) for s in steps] + [_number((run.get("startup_memory") or {}).get("peak_mem_gb"))]
        extra = 0.0
    else:
        figures = [_number(s.get("peak_reserved_gb")) for s in steps]
        extra = CONTEXT_GB
    figures = [f for f in figures if f is not None]
    if not figures:
        return None
    trainer = (run.get("effective_config") or {}).get("trainer") or {}
    total = _number((run.get("environment") or {}).get("gpu_memory_gb"))
    reserved = (trainer.get("vllm_gpu_memory_utilization") or 0.0) * total if trainer.get("use_vllm") and total else 0.0
    return max(max(figures) + extra - reserved, CONTEXT_GB)


def measured_gb(backend: str, folder: Path = STATS_DIR) -> float | None:
    """The most memory an earlier run of `backend` in this study used itself, with a margin; None if none ran."""
    found = [gb for run in _runs_of(backend, folder) if (gb := own_memory_gb(run)) is not None]
    return max(found) * MARGIN if found else None


def need(config: dict, backend: str, *, run: str, alone: bool, folder: Path = STATS_DIR) -> gpus.Need:
    """What a job of `backend` asks of each GPU it leases. `alone`: the study wants this run's speed and memory."""
    sharing = with_defaults("gpu_sharing", config.get("gpu_sharing"))
    if not packs(config) or alone:
        return gpus.Need(whole=True, run=run)
    options = (config.get("backend_options") or {}).get(faults.split(backend)[0], {})
    share = backends.get(backend).gpu_memory_share(options)
    gb = sharing.get("memory_gb")
    if gb is None:
        gb = measured_gb(backend, folder)
        if gb is None:
            return gpus.Need(whole=True, run=run)  # it measures what the next runs of the backend will ask for
    return gpus.Need(whole=False, memory_gb=gb, memory_share=share, jobs_per_gpu=sharing["jobs_per_gpu"], run=run)


# torch.compile's kernel compilation starts a pool of one worker per core of the machine in every process: a dozen
# packed jobs compiling at once (Unsloth's first step) would each start one over the same cores. Beside other
# jobs a job compiles with the cores Snakemake gave it (its threads); a user's own setting wins.
COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"


def compile_with_own_cores(threads: int) -> None:
    os.environ.setdefault(COMPILE_THREADS_ENV, str(max(1, int(threads))))


@contextlib.contextmanager
def leased_for_job(args: dict, log=print):
    """The GPU(s) of a train or rollout-check job (jobs.arguments: its config, backend and lease settings), held
    for the block. When the block is done, the job keeps its GPUs' quiet locks until it exits: freeing its memory
    must not land inside another job's vLLM start (quietlock.quiet)."""
    config = {**args["config"], "gpu_sharing": args.get("gpu_sharing")}
    wanted = need(config, args["backend"], run=args.get("run", ""), alone=bool(args.get("alone")),
                  folder=Path(args.get("stats_dir") or STATS_DIR))
    try:
        with gpus.leased(config["gpus_per_train_job"], wanted, max_devices=args.get("max_gpus"), log=log) as lease:
            if lease.source == "lease" and not lease.need.whole:
                compile_with_own_cores(args.get("threads", 1))
            if packs(config):  # every vLLM engine of the study (its alone runs' too) told its KV cache's size
                os.environ[quietlock.SIZED_ENV] = "1"
            try:
                yield lease
            finally:
                os.environ.pop(quietlock.SIZED_ENV, None)
            if lease.source == "lease":
                quietlock.hold_quiet_until_exit()
    except leasefolder.LeaseFolderError as error:
        raise SystemExit(f"error: {error}") from None
