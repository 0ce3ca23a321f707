"""Finished runs are never trained twice, and a restored run is the run that was asked for.

A train job's result is fixed by its settings (the config values it reads), its code (the hash of the modules
it runs), the content of its input files (the built model and data, or the user's own model folder and data
files), the revision of a hub model or data set, the versions of the packages that train, and the GPU model.
The cache key covers all of these. When the workflow is interrupted, a run that finished may still be marked
incomplete by Snakemake, and `--rerun-incomplete` reruns its job: the job then finds the run here under the
same key and restores it in a second instead of training again. Any change of these is another key, so a stale
run is never restored.

An entry is the statistics file (`KEY.json`), its sha256 (`KEY.sha256`) and the job's training log (`KEY.log`).
An entry whose digest or statistics do not check out is refused with one line, set aside (`.refused-...`, never
deleted) and the run is trained again. A job that Snakemake was told to rerun (`--forcerun`, `--forceall`,
`-f` on its file) trains and replaces the entry; `--config run_cache=false` or GRPO_EQUIVALENCE_RUN_CACHE=off
turns the cache off.

A run that cannot be written where it belongs (a full disk) is kept in the first place that takes it (the
cache, the job's log folder, the user's runtime folder, /dev/shm), each searched by the next run's restore, and
as a last resort printed to the job's stderr.
"""

import hashlib
import json
import os
import shutil
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..analysis import stats
from ..runtime.paths import RUN_CACHE
from .runkey import key, run_identity

SWITCH_ENV = "GRPO_EQUIVALENCE_RUN_CACHE"  # "off": no restore, no store
FORCED_ENV = "GRPO_EQUIVALENCE_FORCED_RUNS"  # the statistics files Snakemake was told to rerun (JSON list)
RESCUE_ENV = "GRPO_EQUIVALENCE_RESCUE_DIRS"  # where a run goes when its own disk is full (os.pathsep-separated)


# Compiled kernels and vLLM's compilation, shared by the jobs of one backend in one study on one machine, so that
# only the first pays for them: a folder per key of what compilation depends on (the settings but the seed and
# step count, the code, the inputs, packages and GPU), so that a change of any never finds a stale one.
COMPILE_CACHE = Path(RUN_CACHE).parent / "compile"
COMPILE_ENV = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "VLLM_CACHE_ROOT": "vllm"}


def use_compile_caches(args: dict, folder: Path = COMPILE_CACHE) -> Path | None:
    """Points torch.compile's, Triton's and vLLM's caches of this job at its study's shared folder (before torch
    is imported); None where the run cache is off or the run's identity is not known (then each library's own
    default)."""
    if os.environ.get(SWITCH_ENV, "").lower() in ("off", "0", "false", "no") or args.get("run_cache") is False:
        return None
    identity, _ = run_identity(args["config"], args["backend"], args["model_path"], args["dataset"])
    if identity is None:
        return None
    config = {k: v for k, v in args["config"].items() if k != "rollout_check"}
    config["grpo"] = {k: v for k, v in config.get("grpo", {}).items() if k != "seed"}
    settings = {"config": config, "backend": args["backend"], "model_path": args["model_path"], "dataset": args["dataset"]}
    shared = Path(folder) / key(settings, args["code"], args.get("inputs", ()), identity, cache=Path(RUN_CACHE))
    for variable, name in COMPILE_ENV.items():
        (shared / name).mkdir(parents=True, exist_ok=True)
        os.environ[variable] = str((shared / name).resolve())
    return shared


def entry(run_key: str, cache: Path = Path(RUN_CACHE)) -> Path:
    return Path(cache) / f"{run_key}.json"


def _sidecars(path: Path) -> tuple[Path, Path]:
    return path.with_suffix(".sha256"), path.with_suffix(".log")


def _adapter_of(path: Path) -> Path:
    return path.with_suffix(".adapter")


def _private_folder(path: Path) -> Path | None:
    """`path` made 0700 if absent, or None where it is not a folder of this user's alone (a folder under a
    shared /dev/shm that someone else made first must not receive this user's run). The rescue folder above a
    checkout's own is made the same way."""
    if path.parent.name.startswith("grpo-equivalence-rescued") and _private_folder(path.parent) is None:
        return None
    try:
        path.mkdir(mode=0o700, exist_ok=True)  # not its parents: /run/user/<uid> is the system's to make
        info = os.lstat(path)
    except OSError:
        return None
    ok = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077
    return path if ok else None


def rescue_folders(log_file: Path | None) -> list[Path]:
    """Where a run goes when the cache's disk is full: the job's log folder, then memory-backed folders (another
    file system than results/, kept until the machine restarts)."""
    if os.environ.get(RESCUE_ENV):
        return [Path(p) for p in os.environ[RESCUE_ENV].split(os.pathsep) if p]
    folders = [Path(log_file).parent / "rescued"] if log_file else []
    # one folder per working directory (checkout): a run rescued there is restored there, never into another
    # checkout of the same user, which other code or data may not have changed the key of
    here = hashlib.sha256(str(Path.cwd().resolve()).encode()).hexdigest()[:12]
    return folders + [Path(f"/run/user/{os.getuid()}/grpo-equivalence-rescued/{here}"),
                      Path(f"/dev/shm/grpo-equivalence-rescued-{os.getuid()}/{here}")]


@dataclass
class JobCache:
    """The run cache as one train job uses it."""

    key: str | None  # None: this job neither restores nor stores (why says why)
    why: str
    restore_allowed: bool  # False for a job Snakemake was told to rerun: it trains and replaces the entry
    cache: Path = Path(RUN_CACHE)
    log_file: Path | None = None
    adapter: Path | None = None  # the run's adapter folder, where the study keeps them (save_adapters)
    # the run this job trains ({"backend", "max_steps", "seed"}): an entry holding another is never restored, as when
    # one key's entry and digest were copied over another's
    run: dict | None = None
    requested: dict | None = None  # the grpo settings this job's study asks for: an entry trained with others is refused

    def places(self) -> list[Path]:
        """The cache, then the rescue folders that exist and are this user's alone."""
        return [self.cache, *(f for f in rescue_folders(self.log_file) if f.exists() and _private_folder(f))]


def for_job(args: dict, settings: dict) -> JobCache:
    """The cache of a train job from its arguments (jobs.arguments) and the settings its key covers."""
    log_file = Path(args["log"]) if args.get("log") else None
    if os.environ.get(SWITCH_ENV, "").lower() in ("off", "0", "false", "no") or args.get("run_cache") is False:
        return JobCache(None, "the run cache is off (run_cache: false, or GRPO_EQUIVALENCE_RUN_CACHE=off)", False,
                        log_file=log_file)
    identity, why = run_identity(args["config"], args["backend"], args["model_path"], args["dataset"])
    if identity is None:
        return JobCache(None, why, False, log_file=log_file)
    forced = json.loads(os.environ.get(FORCED_ENV, "[]"))
    return JobCache(key(settings, args["code"], args["inputs"], identity), "",
                    run={"backend": args["backend"], "max_steps": int(args["steps"]),
                         "seed": args["config"]["grpo"]["seed"]},
                    requested=json.loads(json.dumps(args["config"]["grpo"])),
                    restore_allowed=str(args["out"]) not in forced, log_file=log_file,
                    adapter=Path(args["adapter"]) if args.get("adapter") else None)


def _refuse(path: Path, reason: str, log) -> None:
    """Sets a bad entry aside (never deleted: it may be the only copy of something) and says so in one line."""
    aside = path.with_name(f"{path.name}.refused-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        os.replace(path, aside)
        where = f"set aside as {aside}"
    except OSError as error:
        where = f"left in place ({error.strerror})"
    log(f"run cache entry {path} refused: {reason}; {where}; training instead")


def _verified(path: Path, log) -> tuple[dict, bytes] | None:
    """The entry's run and bytes where its digest and statistics check out; refused (and None) otherwise."""
    digest_file = _sidecars(path)[0]
    try:
        data = path.read_bytes()
        recorded = digest_file.read_text().strip()
    except FileNotFoundError:
        _refuse(path, f"it has no digest ({digest_file.name})", log)
        return None
    if hashlib.sha256(data).hexdigest() != recorded:
        _refuse(path, "its content does not match the digest written with it (edited or damaged)", log)
        return None
    try:
        run = stats.load(path)
        stats.check_complete(run, path)
        stats.check_consistent(run, path)
    except stats.StatsError as error:
        _refuse(path, str(error).replace(f"{path}: ", ""), log)
        return None
    return run, data


def restore(job: JobCache, out: Path, log=print) -> dict | None:
    """The cached run copied to `out`, its training log printed back, or None where there is none to trust."""
    if job.key is None or not job.restore_allowed:
        return None
    for folder in job.places():
        path = entry(job.key, folder)
        if not path.exists() or (job.adapter is not None and not _adapter_of(path).is_dir()):
            continue  # an entry without the adapter this job must write is no use to it
        found = _verified(path, log)
        if found is None:
            continue
        run, data = found
        held = {name: run.get(name) for name in (job.run or {})}
        if job.run and held != job.run:
            _refuse(path, "it holds the run {} x {} (seed {}), not this job's {} x {} (seed {}): an entry copied over "
                          "another's".format(*held.values(), *job.run.values()), log)
            continue
        if job.requested is not None and run.get("requested_grpo") != job.requested:
            asked = run.get("requested_grpo") or {}
            differ = sorted(k for k in set(asked) | set(job.requested) if asked.get(k) != job.requested.get(k))
            _refuse(path, "it was trained with other settings than this study's (" + ", ".join(
                f"{k} {asked.get(k)!r} where this study asks {job.requested.get(k)!r}" for k in differ[:4]) + (
                ")" if asked else "none recorded)"), log)
            continue
        if job.adapter is not None:
            shutil.rmtree(job.adapter, ignore_errors=True)
            shutil.copytree(_adapter_of(path), job.adapter)
        stats.write_text(out, data.decode())
        if folder != job.cache:  # rescued: back into the cache, where it belongs, now that there may be room
            try:
                _write_entry(job.key, data.decode(), _read(_sidecars(path)[1]), job.cache)
            except OSError:
                pass
        finished = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.get("train_finished_at", 0)))
        log(f"[{run['backend']} x {run['max_steps']}] restored from the run cache ({path}, trained until {finished}): "
            f"settings, code, input content, hub revisions, package versions and GPU model are those of this job, "
            f"so it is not trained again (--forcerun train, or --config run_cache=false, trains it anyway)")
        original = _read(_sidecars(path)[1])
        if original:
            log("its training log, as it was written then:\n" + "\n".join(f"| {line}" for line in original.splitlines()))
        return run
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _write_entry(run_key: str, text: str, log_text: str, folder: Path) -> Path:
    """The entry's log, its statistics, then its digest: an entry without a digest is never restored, so a
    write cut short leaves nothing that could be taken for a whole run."""
    path = entry(run_key, folder)
    digest_file, log_copy = _sidecars(path)
    digest_file.unlink(missing_ok=True)
    stats.write_text(log_copy, log_text)
    stats.write_text(path, text)
    stats.write_text(digest_file, hashlib.sha256(text.encode()).hexdigest() + "\n")
    return path


def keep(job: JobCache, result: dict, out: Path, log=print) -> None:
    """Writes the finished run to the cache and to `out`. Where `out` cannot be written (a full disk), the run is
    kept in the first place that takes it, and the job fails naming both; the next run restores it from there."""
    text = stats.checked_json(result, out)
    sys.stdout.flush()
    sys.stderr.flush()
    log_text = _read(job.log_file) if job.log_file else ""
    kept, cache_error = None, None
    if job.key is not None:
        try:
            kept = _write_entry(job.key, text, log_text, job.cache)
            if job.adapter is not None:
                shutil.rmtree(_adapter_of(kept), ignore_errors=True)
                shutil.copytree(job.adapter, _adapter_of(kept))
        except OSError as error:
            cache_error = f"{job.cache}: {error.strerror or error}"
    try:
        stats.write_text(out, text)
        if cache_error:
            log(f"warning: the run could not be stored in the run cache ({cache_error}); {out} is written, so "
                f"nothing is lost, but an interrupted workflow would train it again")
        return
    except OSError as error:
        problem = f"{out} could not be written ({error.strerror or error})"
    for folder in [] if kept else rescue_folders(job.log_file):
        if _private_folder(folder) is None:
            continue
        try:
            kept = (_write_entry(job.key, text, log_text, folder) if job.key is not None
                    else _written(folder / Path(out).name, text))
            break
        except OSError:
            continue
    if kept is not None:
        how = ("rerun snakemake: the job restores it from there without training" if job.key is not None
               else f"copy it to {out} (the run cache is off, so no job looks there)")
        raise SystemExit(f"error: {problem}; the finished run is kept in {kept}. Free space on that disk, then {how}")
    print(text, file=sys.stderr, flush=True)
    raise SystemExit(f"error: {problem}, and no other place took the finished run (the run cache, "
                     f"{', '.join(map(str, rescue_folders(job.log_file)))}); its statistics are printed above: save "
                     f"them as {out} once there is space")


def _written(path: Path, text: str) -> Path:
    stats.write_text(path, text)
    return path
