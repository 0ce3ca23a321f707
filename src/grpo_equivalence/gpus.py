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
import os
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

# For machines where the driver cannot be asked (and for tests): a comma-separated device list.
DEVICES_ENV = "GRPO_EQUIVALENCE_GPUS"
LOCK_DIR_ENV = "GRPO_EQUIVALENCE_GPU_LOCKS"


@dataclass
class Lease:
    devices: list[str]
    source: str  # "lease", "slurm", or "none" (a CPU job)
    waited_s: float = 0.0
    _files: list = field(default_factory=list, repr=False)

    def record(self) -> dict:
        return {"devices": self.devices, "source": self.source, "waited_s": round(self.waited_s, 3)}


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


def _try_lock(path: Path):
    """An open, exclusively locked lock file, or None if another job holds it. Never follows a link."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise LeaseFolderError(f"GPU lease file {path} cannot be opened ({error.strerror}: a link or another "
                               f"user's file?); remove it, or set {LOCK_DIR_ENV} to a folder of your own") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        raise LeaseFolderError(f"GPU lease file {path} is not a plain file of this user's; remove it, or set "
                               f"{LOCK_DIR_ENV} to a folder of your own")
    handle = os.fdopen(fd, "r+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def slurm_assigned() -> list[str] | None:
    """The devices SLURM gave this job where it is a job of Snakemake's SLURM executor (its own allocation),
    else None: outside SLURM, and for local jobs inside an allocation, which share its devices."""
    from .jobs import under_slurm_executor

    if not os.environ.get("SLURM_JOB_ID") or not under_slurm_executor():
        return None
    assigned = os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("SLURM_JOB_GPUS") or ""
    return [d for d in assigned.split(",") if d]


def acquire(count: int, *, poll_s: float = 2.0, log=print) -> Lease:
    """Leases `count` devices, waiting while fewer are free; all or nothing, so waiters never deadlock."""
    if count == 0:
        return Lease(devices=[], source="none")
    assigned = slurm_assigned()
    if assigned is not None:
        return Lease(devices=assigned, source="slurm")
    devices = visible_devices()
    if len(devices) < count:
        raise RuntimeError(
            f"this job needs {count} GPU(s) but {len(devices)} are visible ({devices or 'none'}); lower "
            f"gpus_per_train_job, or make more devices visible (CUDA_VISIBLE_DEVICES, {DEVICES_ENV})"
        )
    folder = lock_dir()
    start = time.monotonic()
    announced = False
    while True:
        held = []
        for device in devices:
            handle = _try_lock(folder / f"gpu-{device}.lock")
            if handle is not None:
                held.append((device, handle))
                if len(held) == count:
                    lease = Lease(devices=[d for d, _ in held], source="lease", waited_s=time.monotonic() - start,
                                  _files=[h for _, h in held])
                    for handle in lease._files:  # who holds it, for a person looking at the lock folder
                        handle.truncate(0)
                        handle.write(f"{os.getpid()}\n")
                        handle.flush()
                    return lease
        for _, handle in held:
            handle.close()  # closing releases the lock
        if not announced:
            log(f"waiting for {count} free GPU(s) among {devices} (leases in {folder})")
            announced = True
        time.sleep(poll_s)


def release(lease: Lease) -> None:
    for handle in lease._files:
        handle.close()
    lease._files.clear()


@contextlib.contextmanager
def leased(count: int, *, log=print):
    """Holds `count` GPUs for the block and makes them the only ones CUDA sees in this process."""
    lease = acquire(count, log=log)
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    if lease.source == "lease":
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(lease.devices)
        log(f"holding GPU(s) {', '.join(lease.devices)}" + (f" after waiting {lease.waited_s:.0f} s" if lease.waited_s >= 1 else ""))
    try:
        yield lease
    finally:
        release(lease)
        if lease.source == "lease":
            if previous is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = previous


def main(argv=None) -> int:
    """`python -m grpo_equivalence.gpus COUNT -- COMMAND ...`: run COMMAND holding COUNT leased GPUs."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        sys.exit("usage: python -m grpo_equivalence.gpus COUNT -- COMMAND [ARG ...]")
    try:
        with leased(int(argv[0]), log=lambda s: print(s, file=sys.stderr, flush=True)):
            return subprocess.run(argv[2:]).returncode
    except LeaseFolderError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    raise SystemExit(main())
