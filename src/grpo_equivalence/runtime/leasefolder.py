"""The folder that holds the GPU leases (gpus): the user's own, shared by every workflow of that user on the machine.

It is created 0700 and checked for owner, type and mode, and its files are opened without following links, so that
another user can neither point a lock at a file of this user's nor hold or remove their leases.
"""

import fcntl
import json
import os
import stat
from pathlib import Path

LOCK_DIR_ENV = "GRPO_EQUIVALENCE_GPU_LOCKS"


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


def open_file(path: Path, flags=os.O_RDWR | os.O_CREAT):
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


def try_lock(path: Path):
    """An open, exclusively locked lock file, or None if another job holds it. Never follows a link."""
    handle = open_file(path)
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
def slot_paths(folder: Path, device: str) -> list[Path]:
    return sorted(folder.glob(f"gpu-{device}.slot-*.lock"), key=lambda p: int(p.name.rsplit("-", 1)[1].split(".")[0]))


def holders(folder: Path, device: str) -> tuple[list[dict], int]:
    """The records of the jobs on `device` (their slot files are locked), and the lowest free slot number."""
    holders, used = [], set()
    for path in slot_paths(folder, device):
        number = int(path.name.rsplit("-", 1)[1].split(".")[0])
        handle = try_lock(path)
        if handle is not None:  # free: its job ended, however it ended
            handle.close()
            continue
        used.add(number)
        try:
            with open_file(path, os.O_RDONLY) as f:
                holders.append(json.loads(f.read() or "{}"))
        except ValueError:
            holders.append({})  # unreadable: counted as a whole-device job, the safe side
    return holders, next(k for k in range(len(used) + 1) if k not in used)


def reserved_by_other(folder: Path, device: str, mine: dict) -> bool:
    if device in mine:
        return False
    handle = try_lock(folder / f"gpu-{device}.reserve")
    if handle is None:
        return True
    handle.close()
    return False


def journal(folder: Path | None, device: str) -> list[dict]:
    if folder is None:
        return []
    try:
        with open_file(folder / f"gpu-{device}.journal", os.O_RDONLY) as f:
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

