"""Each running train job holds its own GPU(s) for its whole life.

Snakemake's `--resources gpu=N` only counts GPUs; it does not say which one a job should use, so without
this every job would land on GPU 0. A job leases devices from the visible ones (CUDA_VISIBLE_DEVICES as
the user set it, else every GPU the driver lists) by taking an exclusive `flock` on one lock file per
device. The kernel releases a flock when its process ends, however it ends, so a killed job's GPU comes
back by itself; a request that finds too few free devices waits and retries.

Under SLURM's executor (snakemake-executor-plugin-slurm) each job is its own allocation and SLURM gave it its
devices, so the lease steps aside. A job run locally inside an allocation (Snakemake started in an `salloc`
shell or an sbatch script) shares the allocation's devices with the other local jobs and leases within them.

The lease folder is the user's own (their runtime folder where there is one): created 0700, checked for owner,
type and mode, and lock files are opened without following links, so that another user can neither point a
lock at a file of this user's nor hold or remove their leases.
"""

import contextlib
import fcntl
import json
import os
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

# For machines where the driver cannot be asked (and for tests): a comma-separated device list.
DEVICES_ENV = "GRPO_EQUIVALENCE_GPUS"
LOCK_DIR_ENV = "GRPO_EQUIVALENCE_GPU_LOCKS"


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
            for entry in _journal(self.folder, device):
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


# One folder per machine and user, shared by every workflow on it, so that two workflows on one box do not
# share a GPU either. A fixed path, not $TMPDIR or $XDG_RUNTIME_DIR: Snakemake sets each job's TMPDIR from its
# `tmpdir` resource (two workflows whose jobs saw different ones both took GPU 0), and a cron job or a
# detached shell may lack XDG_RUNTIME_DIR where the folder itself exists.
RUNTIME_ROOT = Path("/run/user")
LOCK_ROOT = Path("/tmp")
FOLDER_NAME = "grpo-equivalence-gpu-leases"


class LeaseFolderError(RuntimeError):
    pass


def _own_private_folder(path: Path) -> bool:
    """Whether `path` is a real folder (not a link) that this user owns and no one else may enter."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def lock_dir() -> Path:
    """The lease folder, made 0700 if absent; a LeaseFolderError if it is not this user's alone."""
    if os.environ.get(LOCK_DIR_ENV):
        path = Path(os.environ[LOCK_DIR_ENV])
    else:
        runtime = RUNTIME_ROOT / str(os.getuid())  # systemd's per-user folder: no one else can create it
        path = runtime / FOLDER_NAME if _own_private_folder(runtime) else LOCK_ROOT / f"{FOLDER_NAME}-{os.getuid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise LeaseFolderError(f"GPU lease folder {path} cannot be created ({error.strerror}); set {LOCK_DIR_ENV} to "
                               f"a folder of your own") from None
    if not _own_private_folder(path):
        info = os.lstat(path)
        why = ("is a link" if stat.S_ISLNK(info.st_mode) else "is not a folder" if not stat.S_ISDIR(info.st_mode)
               else f"belongs to uid {info.st_uid}" if info.st_uid != os.getuid()
               else f"is open to others (mode {stat.S_IMODE(info.st_mode):03o})")
        raise LeaseFolderError(f"GPU lease folder {path} {why}, so another user could hold or redirect this user's "
                               f"GPU leases; remove it (or chmod 700 it if it is yours), or set {LOCK_DIR_ENV} to a "
                               f"folder of your own")
    return path


def _open(path: Path, flags=os.O_RDWR | os.O_CREAT):
    """A lease file of this user's, opened without following a link (LeaseFolderError otherwise)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise LeaseFolderError(f"GPU lease file {path} cannot be opened ({error.strerror}: a link or another "
                               f"user's file?); remove it, or set {LOCK_DIR_ENV} to a folder of your own") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        raise LeaseFolderError(f"GPU lease file {path} is not a plain file of this user's; remove it, or set "
                               f"{LOCK_DIR_ENV} to a folder of your own")
    return os.fdopen(fd, "r+")


def _try_lock(path: Path):
    """An open, exclusively locked lock file, or None if another job holds it. Never follows a link."""
    handle = _open(path)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


# Files of one device in the lease folder: gpu-D.lock (held for a moment while a job is admitted: admissions to
# a device happen one at a time), gpu-D.slot-K.lock (one per job on the device, flocked for the job's life, its
# content the job's record), gpu-D.reserve (flocked by a job waiting for the whole device, so that jobs
# admitted after it cannot starve it), gpu-D.journal (a line per admission: which jobs overlapped).
def _slot_paths(folder: Path, device: str) -> list[Path]:
    return sorted(folder.glob(f"gpu-{device}.slot-*.lock"), key=lambda p: int(p.name.rsplit("-", 1)[1].split(".")[0]))


def _holders(folder: Path, device: str) -> tuple[list[dict], int]:
    """The records of the jobs on `device` (their slot files are locked), and the lowest free slot number."""
    holders, used = [], set()
    for path in _slot_paths(folder, device):
        number = int(path.name.rsplit("-", 1)[1].split(".")[0])
        handle = _try_lock(path)
        if handle is not None:  # free: its job ended, however it ended
            handle.close()
            continue
        used.add(number)
        try:
            with _open(path, os.O_RDONLY) as f:
                holders.append(json.loads(f.read() or "{}"))
        except ValueError:
            holders.append({})  # unreadable: counted as a whole-device job, the safe side
    return holders, next(k for k in range(len(used) + 1) if k not in used)


def _reserved_by_other(folder: Path, device: str, mine: dict) -> bool:
    if device in mine:
        return False
    handle = _try_lock(folder / f"gpu-{device}.reserve")
    if handle is None:
        return True
    handle.close()
    return False


def _journal(folder: Path | None, device: str) -> list[dict]:
    if folder is None:
        return []
    try:
        with _open(folder / f"gpu-{device}.journal", os.O_RDONLY) as f:
            lines = f.read().splitlines()
    except LeaseFolderError:
        return []
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


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
        admission = [(d, _open(folder / f"gpu-{d}.lock")) for d in devices]  # in a fixed order: no deadlock
        try:
            for _, handle in admission:
                fcntl.flock(handle, fcntl.LOCK_EX)
            state = {d: _holders(folder, d) for d in devices}
            fitting = [d for d in devices if _fits(need, state[d][0], capacity[d])
                       and not _reserved_by_other(folder, d, reserved)]
            fitting.sort(key=lambda d: (len(state[d][0]), devices.index(d)))
            if len(fitting) >= count:
                chosen = fitting[:count]
                now = time.time()
                record = {"id": job_id, "run": need.run, "pid": os.getpid(), "since": now, "whole": need.whole,
                          "jobs_per_gpu": need.jobs_per_gpu}
                files = []
                for d in chosen:
                    slot = _try_lock(folder / f"gpu-{d}.slot-{state[d][1]}.lock")  # free: we hold the admission
                    slot.truncate(0)
                    slot.write(json.dumps({**record, "memory_gb": need.gb(capacity[d] or 0.0)}))
                    slot.flush()
                    files.append(slot)
                    with _open(folder / f"gpu-{d}.journal", os.O_WRONLY | os.O_APPEND | os.O_CREAT) as journal:
                        journal.write(json.dumps({"id": job_id, "run": need.run, "t": now}) + "\n")
                neighbours = sorted({h.get("run") or h.get("id", "?") for d in chosen for h in state[d][0]})
                for handle in reserved.values():
                    handle.close()
                return Lease(devices=chosen, source="lease", waited_s=time.monotonic() - start, need=need,
                             capacity_gb={d: capacity[d] or 0.0 for d in chosen}, id=job_id, admitted_at=now,
                             neighbours=neighbours, folder=folder, _files=files)
            if need.whole:  # hold back later jobs from the devices this one waits for
                wanted = sorted(devices, key=lambda d: (_reserved_by_other(folder, d, reserved), len(state[d][0]),
                                                        devices.index(d)))[:count]
                for d in list(reserved):
                    if d not in wanted:
                        reserved.pop(d).close()
                for d in wanted:
                    if d not in reserved:
                        handle = _try_lock(folder / f"gpu-{d}.reserve")
                        if handle is not None:
                            reserved[d] = handle
        finally:
            for _, handle in admission:
                handle.close()  # closing releases the lock
        if not announced:
            log(f"waiting for {count} GPU(s) with room for {need.describe()} among {devices} (leases in {folder})")
            announced = True
        time.sleep(poll_s)


# A vLLM engine sizes its KV cache from the device's free memory before and after a profiling pass, assuming that
# no other process changes its memory meanwhile (it stops with "Error in memory profiling" when one frees some,
# and counts another's growth as its own). Jobs sharing a device therefore take its quiet lock (gpu-D.quiet):
# exclusively while they start an engine (they measure), shared while they load a model or end (they change the
# device's memory). Changes may overlap each other, never a measurement; an engine start that waits goes first
# through the turnstile (gpu-D.turn), so that a stream of loading and ending jobs cannot keep it waiting for
# ever. QUIET_ENV names the quiet files of this job's devices, for the vLLM backends.
QUIET_ENV = "GRPO_EQUIVALENCE_GPU_QUIET"
# Set in every job of a study whose jobs share GPUs (gpushare): its vLLM engines are told their KV cache's size
# rather than measure the device's memory (backends._vllm.kv_cache_bytes), so that none needs the lock exclusively
SIZED_ENV = "GRPO_EQUIVALENCE_VLLM_KV_SIZED"


def _take_quiet(paths: list[str], measuring: bool) -> list:
    turns = [_open(Path(p).with_suffix(".turn")) for p in paths]
    try:
        for turn in turns:
            fcntl.flock(turn, fcntl.LOCK_EX)
        handles = [_open(Path(p)) for p in paths]
        for handle in handles:
            fcntl.flock(handle, fcntl.LOCK_EX if measuring else fcntl.LOCK_SH)
        return handles
    finally:
        for turn in turns:
            turn.close()  # closing releases the turnstile


@contextlib.contextmanager
def quiet(paths: list[str] | None = None, log=print, *, measuring: bool = False):
    """Holds the quiet locks of this job's devices (QUIET_ENV) for the block, exclusively when `measuring` (a vLLM
    engine's start), shared otherwise; nothing where there are none."""
    global _QUIET_DEPTH
    paths = sorted(paths if paths is not None else quiet_paths())
    if _QUIET_DEPTH or _QUIET_AT_EXIT or not paths:  # held already by this process (a second flock would wait)
        yield
        return
    _QUIET_DEPTH += 1
    try:
        _hold_quiet(paths, measuring, log)
        yield
    finally:
        _QUIET_DEPTH -= 1
        for handle in _QUIET_HELD.pop("handles", []):
            handle.close()
        _QUIET_HELD.clear()


def _hold_quiet(paths: list[str], measuring: bool, log) -> None:
    began = time.monotonic()
    _QUIET_HELD.update(paths=paths, mode="exclusive" if measuring else "shared", handles=_take_quiet(paths, measuring))
    if time.monotonic() - began >= 1:
        log(f"waited {time.monotonic() - began:.0f} s for other jobs on the GPU to finish " +
            ("loading or ending" if measuring else "starting a vLLM engine"))


def measure_from_here(log=print) -> None:
    """Within quiet(), shared: holds the locks exclusively from here to the block's end (a vLLM engine start that
    found it must profile the device's memory after all). The shared lock is let go first, so two such starts
    cannot wait for each other."""
    if _QUIET_HELD.get("mode") != "shared":
        return
    for handle in _QUIET_HELD.pop("handles"):
        handle.close()
    _hold_quiet(_QUIET_HELD["paths"], True, log)


_QUIET_DEPTH = 0
_QUIET_HELD: dict = {}  # what quiet() holds: paths, mode, handles


def quiet_paths() -> list[str]:
    """The quiet files of this job's leased devices (none outside a lease)."""
    return list(filter(None, os.environ.get(QUIET_ENV, "").split(os.pathsep)))


def quiet_held() -> str | None:
    """How this process holds its devices' quiet locks now: "exclusive", "shared" (until it exits counts), or None."""
    return "shared" if _QUIET_AT_EXIT else _QUIET_HELD.get("mode")


def hold_quiet_until_exit() -> None:
    """Takes the quiet locks (shared) for the rest of the process: its memory is freed when it exits, and the
    kernel drops the locks once its files are closed (after the GPU's: they were opened first)."""
    global _QUIET_AT_EXIT
    if _QUIET_AT_EXIT:
        return
    paths = sorted(quiet_paths())
    if paths:
        _QUIET_AT_EXIT = _take_quiet(paths, measuring=False)


_QUIET_AT_EXIT: list = []


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
    """`python -m grpo_equivalence.gpus COUNT [options] -- COMMAND ...`: run COMMAND holding COUNT leased GPUs;
    COMMAND finds the lease's record (gpu_lease of the statistics) in the file named by GRPO_EQUIVALENCE_LEASE_RECORD
    once it ends, if that variable is set."""
    import argparse
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        sys.exit("usage: python -m grpo_equivalence.gpus COUNT [--memory-gb GB] [--share F] [--jobs-per-gpu N] "
                 "[--run NAME] -- COMMAND [ARG ...]")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m grpo_equivalence.gpus")
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
