"""Each running train job holds its own GPU(s) for its whole life.

Snakemake's `--resources gpu=N` only counts GPUs; it does not say which one a job should use, so without
this every job would land on GPU 0. A job leases devices from the visible ones (CUDA_VISIBLE_DEVICES as
the user set it, else every GPU the driver lists) by taking an exclusive `flock` on one lock file per
device. The kernel releases a flock when its process ends, however it ends, so a killed job's GPU comes
back by itself; a request that finds too few free devices waits and retries.

Under SLURM's executor (snakemake-executor-plugin-slurm) each job is its own allocation and SLURM gave it its
devices, so the lease steps aside. A job run locally inside an allocation (Snakemake started in an `salloc`
shell or an sbatch script) shares the allocation's devices with the other local jobs and leases within them.

The leases live in the user's own folder (leasefolder); jobs sharing a GPU keep its memory still while a vLLM
engine measures it (quietlock).
"""

import contextlib
import fcntl
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .leasefolder import LeaseFolderError, holders, journal, lock_dir, open_file, reserved_by_other, try_lock
from .quietlock import QUIET_ENV

# For machines where the driver cannot be asked (and for tests): a comma-separated device list.
DEVICES_ENV = "GRPO_EQUIVALENCE_GPUS"


@dataclass(frozen=True)
class Need:
    """What a job needs of each device it leases. `whole`: the device to itself (no other job admitted while it
    holds it, and it waits for the device to empty); otherwise `memory_gb` plus `memory_share` of the device's
    memory, beside at most `jobs_per_gpu` - 1 other jobs (the smallest limit of the jobs on a device counts)."""
    whole: bool = True
    memory_gb: float = 0.0
    memory_share: float = 0.0  # a fraction of the device's memory: vLLM reserves gpu_memory_utilization of it
    jobs_per_gpu: int = 1
    run: str = ""  # the job's name in other jobs' records (which runs overlapped on a device)

    def gb(self, capacity_gb: float) -> float:
        return capacity_gb if self.whole else self.memory_gb + self.memory_share * capacity_gb

    def describe(self) -> str:
        if self.whole:
            return "a whole GPU"
        share = f" + {self.memory_share:.0%} of its memory" if self.memory_share else ""
        return f"{self.memory_gb:.1f} GB{share} of a GPU (at most {self.jobs_per_gpu} jobs on one)"


@dataclass
class Lease:
    devices: list[str]
    source: str  # "lease", "slurm", or "none" (a CPU job)
    waited_s: float = 0.0
    need: Need = field(default_factory=Need)
    capacity_gb: dict = field(default_factory=dict)  # device: its memory, as the lease counted it
    id: str = ""
    admitted_at: float = 0.0
    neighbours: list = field(default_factory=list)  # jobs on the devices when this one was admitted
    folder: Path | None = None
    _files: list = field(default_factory=list, repr=False)

    def shared_with(self) -> list[str] | None:
        """The other jobs that held one of this lease's devices at some time since it was admitted: those there at
        admission, and every job admitted to them since (each device's journal). None where not known (SLURM
        allocations are the scheduler's; SLURM does not share a GPU between jobs unless configured to)."""
        if self.source != "lease":
            return [] if self.source == "slurm" else None
        later = []
        for device in self.devices:
            for entry in journal(self.folder, device):
                if entry.get("t", 0) >= self.admitted_at and entry.get("id") != self.id:
                    later.append(entry.get("run") or entry.get("id"))
        return sorted(set(self.neighbours) | set(later))

    def record(self) -> dict:
        return {"devices": self.devices, "source": self.source, "waited_s": round(self.waited_s, 3),
                "whole": self.need.whole, "memory_gb": {d: round(self.need.gb(c), 2) for d, c in self.capacity_gb.items()},
                "jobs_per_gpu": self.need.jobs_per_gpu, "shared_with": self.shared_with()}


def visible_devices() -> list[str]:
    """The devices this process may use, in the user's terms (indices or UUIDs)."""
    for env in (DEVICES_ENV, "CUDA_VISIBLE_DEVICES"):
        value = os.environ.get(env)
        if value is not None:
            return [d.strip() for d in value.split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


MEMORY_ENV = "GRPO_EQUIVALENCE_GPU_MEMORY_GB"  # each device's memory, where the driver cannot be asked (tests)


def device_memory_gb(devices: list[str]) -> dict[str, float | None]:
    """Each device's memory in GB (1e9 bytes) as the driver reports it, None where it cannot be asked."""
    if os.environ.get(MEMORY_ENV):
        return {d: float(os.environ[MEMORY_ENV]) for d in devices}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {d: None for d in devices}
    found = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3 and cells[2].isdigit():
            found[cells[0]] = found[cells[1]] = int(cells[2]) * 2**20 / 1e9  # MiB
    return {d: found.get(d) for d in devices}


# Of a device's memory, what jobs may ask for in all: the driver keeps some, and a share's rounding is not exact
USABLE = 0.95


def _fits(need: Need, holders: list[dict], capacity: float | None) -> bool:
    if not holders:
        return True
    if need.whole or any(h.get("whole", True) for h in holders) or capacity is None:
        return False
    limit = min([need.jobs_per_gpu] + [h.get("jobs_per_gpu", 1) for h in holders])
    used = sum(h.get("memory_gb", capacity) for h in holders)
    return len(holders) + 1 <= limit and used + need.gb(capacity) <= capacity * USABLE


def slurm_assigned() -> list[str] | None:
    """The devices SLURM gave this job where it is a job of Snakemake's SLURM executor (its own allocation),
    else None: outside SLURM, and for local jobs inside an allocation, which share its devices."""
    from .jobs import under_slurm_executor

    if not os.environ.get("SLURM_JOB_ID") or not under_slurm_executor():
        return None
    assigned = os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("SLURM_JOB_GPUS") or ""
    return [d for d in assigned.split(",") if d]


def acquire(count: int, need: Need = Need(), *, max_devices: int | None = None, poll_s: float = 2.0,
            log=print) -> Lease:
    """Leases `count` devices on which `need` fits, waiting while fewer do; all or nothing, so waiters never
    deadlock. Devices with fewer jobs go first (packed jobs slow each other). `max_devices`: use only the first
    so many visible devices (Snakemake's `--resources gpu=N`)."""
    if count == 0:
        return Lease(devices=[], source="none", need=need)
    assigned = slurm_assigned()
    if assigned is not None:
        return Lease(devices=assigned, source="slurm", need=need)
    devices = visible_devices()[:max_devices]
    if len(devices) < count:
        raise RuntimeError(
            f"this job needs {count} GPU(s) but {len(devices)} are visible ({devices or 'none'}); lower "
            f"gpus_per_train_job, or make more devices visible (CUDA_VISIBLE_DEVICES, {DEVICES_ENV}"
            f"{', --resources gpu=N' if max_devices is not None else ''})"
        )
    capacity = device_memory_gb(devices)
    if not need.whole and any(c is not None and need.gb(c) > c * USABLE for c in capacity.values()):
        raise RuntimeError(f"this job needs {need.describe()}, more than a GPU has ({capacity}); lower the memory "
                           f"it asks for (gpu_sharing), or give it a whole GPU (gpu_sharing.jobs_per_gpu: 1)")
    folder = lock_dir()
    start = time.monotonic()
    announced = False
    reserved: dict[str, object] = {}  # a whole-device waiter's reservations
    job_id = f"{os.uname().nodename}:{os.getpid()}:{time.time():.6f}"
    while True:
        admission = [(d, open_file(folder / f"gpu-{d}.lock")) for d in devices]  # in a fixed order: no deadlock
        try:
            for _, handle in admission:
                fcntl.flock(handle, fcntl.LOCK_EX)
            state = {d: holders(folder, d) for d in devices}
            fitting = [d for d in devices if _fits(need, state[d][0], capacity[d])
                       and not reserved_by_other(folder, d, reserved)]
            fitting.sort(key=lambda d: (len(state[d][0]), devices.index(d)))
            if len(fitting) >= count:
                chosen = fitting[:count]
                now = time.time()
                record = {"id": job_id, "run": need.run, "pid": os.getpid(), "since": now, "whole": need.whole,
                          "jobs_per_gpu": need.jobs_per_gpu}
                files = []
                for d in chosen:
                    slot = try_lock(folder / f"gpu-{d}.slot-{state[d][1]}.lock")  # free: we hold the admission
                    slot.truncate(0)
                    slot.write(json.dumps({**record, "memory_gb": need.gb(capacity[d] or 0.0)}))
                    slot.flush()
                    files.append(slot)
                    with open_file(folder / f"gpu-{d}.journal", os.O_WRONLY | os.O_APPEND | os.O_CREAT) as log_file:
                        log_file.write(json.dumps({"id": job_id, "run": need.run, "t": now}) + "\n")
                neighbours = sorted({h.get("run") or h.get("id", "?") for d in chosen for h in state[d][0]})
                for handle in reserved.values():
                    handle.close()
                return Lease(devices=chosen, source="lease", waited_s=time.monotonic() - start, need=need,
                             capacity_gb={d: capacity[d] or 0.0 for d in chosen}, id=job_id, admitted_at=now,
                             neighbours=neighbours, folder=folder, _files=files)
            if need.whole:  # hold back later jobs from the devices this one waits for
                wanted = sorted(devices, key=lambda d: (reserved_by_other(folder, d, reserved), len(state[d][0]),
                                                        devices.index(d)))[:count]
                for d in list(reserved):
                    if d not in wanted:
                        reserved.pop(d).close()
                for d in wanted:
                    if d not in reserved:
                        handle = try_lock(folder / f"gpu-{d}.reserve")
                        if handle is not None:
                            reserved[d] = handle
        finally:
            for _, handle in admission:
                handle.close()  # closing releases the lock
        if not announced:
            log(f"waiting for {count} GPU(s) with room for {need.describe()} among {devices} (leases in {folder})")
            announced = True
        time.sleep(poll_s)


def release(lease: Lease) -> None:
    for handle in lease._files:
        handle.close()
    lease._files.clear()


@contextlib.contextmanager
def leased(count: int, need: Need = Need(), *, max_devices: int | None = None, log=print):
    """Holds `count` GPUs for the block and makes them the only ones CUDA sees in this process."""
    lease = acquire(count, need, max_devices=max_devices, log=log)
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    if lease.source == "lease":
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(lease.devices)
        os.environ[QUIET_ENV] = os.pathsep.join(str(lease.folder / f"gpu-{d}.quiet") for d in lease.devices)
        beside = f" beside {len(lease.neighbours)} other job(s)" if lease.neighbours else ""
        log(f"holding GPU(s) {', '.join(lease.devices)} ({lease.need.describe()}){beside}" +
            (f" after waiting {lease.waited_s:.0f} s" if lease.waited_s >= 1 else ""))
    try:
        yield lease
    finally:
        release(lease)
        if lease.source == "lease":
            os.environ.pop(QUIET_ENV, None)
            if previous is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = previous


def main(argv=None) -> int:
    """`python -m grpo_equivalence.runtime.gpus COUNT [options] -- COMMAND ...`: run COMMAND holding COUNT leased GPUs;
    COMMAND finds the lease's record (gpu_lease of the statistics) in the file named by GRPO_EQUIVALENCE_LEASE_RECORD
    once it ends, if that variable is set."""
    import argparse
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        sys.exit("usage: python -m grpo_equivalence.runtime.gpus COUNT [--memory-gb GB] [--share F] [--jobs-per-gpu N] "
                 "[--run NAME] -- COMMAND [ARG ...]")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m grpo_equivalence.runtime.gpus")
    parser.add_argument("count", type=int)
    parser.add_argument("--memory-gb", type=float, help="share the GPU: this much of its memory (default: a whole GPU)")
    parser.add_argument("--share", type=float, default=0.0, help="and this fraction of its memory")
    parser.add_argument("--jobs-per-gpu", type=int, default=1)
    parser.add_argument("--run", default="")
    args = parser.parse_args(argv[:split])
    need = Need(whole=args.memory_gb is None and not args.share, memory_gb=args.memory_gb or 0.0,
                memory_share=args.share, jobs_per_gpu=args.jobs_per_gpu, run=args.run)
    try:
        with leased(args.count, need, log=lambda s: print(s, file=sys.stderr, flush=True)) as lease:
            code = subprocess.run(argv[split + 1:]).returncode
            if os.environ.get("GRPO_EQUIVALENCE_LEASE_RECORD"):
                with open(os.environ["GRPO_EQUIVALENCE_LEASE_RECORD"], "a") as f:
                    f.write(json.dumps(lease.record()) + "\n")
            return code
    except LeaseFolderError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    raise SystemExit(main())
