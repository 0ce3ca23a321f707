"""Finished runs are never trained twice: a cache of statistics files keyed by everything a run depends on.

A train job's result is fixed by its settings (the config values it reads), its code (the hash of the
modules it runs) and the content of its input files (the built model and data). When the workflow is
interrupted, a run that finished may still be marked incomplete by Snakemake, and `--rerun-incomplete`
reruns its job: the job then finds the run here under the same key and restores it in a second instead
of training again. Any change of settings, code or inputs is another key, so a stale run is never restored.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

from . import stats
from .paths import RUN_CACHE


def _content(path: Path, digest) -> None:
    """Names and bytes of a file, or of every file under a folder, in a fixed order."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode() + b"\0")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)


def key(settings: dict, code: str, inputs=()) -> str:
    """The run's identity: settings, code hash and the content of its input files and folders."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode() + b"\0" + code.encode())
    for path in sorted(map(Path, inputs)):
        _content(path, digest)
    return digest.hexdigest()[:32]


def entry(run_key: str, cache: Path = Path(RUN_CACHE)) -> Path:
    return Path(cache) / f"{run_key}.json"


def restore(run_key: str, out: Path, cache: Path = Path(RUN_CACHE)) -> dict | None:
    """The cached run copied to `out`, or None where there is none (or it is not a whole, valid run)."""
    path = entry(run_key, cache)
    if not path.exists():
        return None
    try:
        run = stats.load(path)
        stats.check_complete(run, path)
    except stats.StatsError:
        return None  # a damaged entry is a miss: the job trains and overwrites it
    _copy(path, Path(out))
    return run


def store(run_key: str, out: Path, cache: Path = Path(RUN_CACHE)) -> Path:
    path = entry(run_key, cache)
    _copy(Path(out), path)
    return path


def _copy(src: Path, dst: Path) -> None:
    """Atomic: a reader never sees half a file."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".partial")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
