"""A GPU's quiet lock: no job changes a device's memory while a vLLM engine beside it measures it."""

import contextlib
import fcntl
import os
import time
from pathlib import Path

from .leasefolder import open_file

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
    turns = [open_file(Path(p).with_suffix(".turn")) for p in paths]
    try:
        for turn in turns:
            fcntl.flock(turn, fcntl.LOCK_EX)
        handles = [open_file(Path(p)) for p in paths]
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

