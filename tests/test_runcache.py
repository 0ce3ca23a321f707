"""The run cache restores only the run that was asked for: its key, its entries' digest and consistency, and
where a finished run goes when its own disk is full. (Whole-workflow cases are in test_reliability.)"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_equivalence.analysis import stats
from grpo_equivalence.study import runcache, runkey
from helpers import make_stats


def job(tmp_path, key="k", **changes) -> runcache.JobCache:
    return runcache.JobCache(**{"key": key, "why": "", "restore_allowed": True, "cache": tmp_path / "cache",
                                "log_file": tmp_path / "logs" / "train.log", **changes})


def stored(tmp_path, run=None, key="k") -> runcache.JobCache:
    """A cache holding `run` under `key`, as a train job leaves it."""
    cache = job(tmp_path, key)
    cache.log_file.parent.mkdir(parents=True, exist_ok=True)
    cache.log_file.write_text("[hf x 5] training\nstep 1 ...\n")
    runcache.keep(cache, run or make_stats("hf", 5), tmp_path / "first.json", log=lambda s: None)
    return cache


def test_the_key_follows_settings_code_input_content_packages_devices_and_revisions(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights").write_bytes(b"abc")
    identity = {"packages": {"trl": "1.16.0"}, "devices": ["cpu"], "revisions": {}}
    key = lambda settings=None, code="c1", ident=identity: runkey.key(settings or {"lr": 1}, code, [model], ident,  # noqa: E731
                                                                       cache=tmp_path / "cache")
    base = key()
    assert base == key()
    assert base != key({"lr": 2})
    assert base != key(code="c2")
    assert base != key(ident={**identity, "packages": {"trl": "1.15.0"}})
    assert base != key(ident={**identity, "devices": ["NVIDIA H200"]})
    assert base != key(ident={**identity, "revisions": {"model:org/m": "abc"}})
    (model / "weights").write_bytes(b"abd")  # same size: the digest, not the size, tells
    assert base != key()


def test_a_file_rewritten_with_its_old_size_and_mtime_is_hashed_again(tmp_path):
    """Content digests are remembered by size, times and inode (hashing a 4B model's 8 GB at every job would
    cost minutes); a rewrite that keeps size and mtime, as `cp -p` or a restore from backup does, must not
    reuse the old digest."""
    data = tmp_path / "data.jsonl"
    data.write_text('{"solution": "12"}\n')
    before = os.stat(data)
    first = runkey.key({}, "c", [data], cache=tmp_path / "cache")
    data.write_text('{"solution": "99"}\n')
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(data).st_size == before.st_size and os.stat(data).st_mtime_ns == before.st_mtime_ns
    assert runkey.key({}, "c", [data], cache=tmp_path / "cache") != first


def test_package_versions_name_the_backends_own_packages():
    versions = runkey.package_versions("hf")
    assert set(runkey.TRAINING_PACKAGES) <= set(versions) and versions["trl"]
    assert "unsloth_zoo" in runkey.package_versions("vllm") and "vllm" in runkey.package_versions("vllm")
    # a configuration's kernels, or the study's own setting, are part of what trains the run (absent here: None)
    assert "liger-kernel" in runkey.package_versions("native+liger") and "liger-kernel" not in versions
    assert "liger-kernel" in runkey.package_versions("hf", {"use_liger_kernel": True})


def test_a_hub_id_keys_on_its_revision_and_an_unknown_one_turns_the_cache_off(tmp_path, monkeypatch, tiny_config):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    dataset = {"path": "json", "data_files": "x.jsonl"}
    identity, why = runkey.run_identity(tiny_config, "hf", "org/model", dataset)
    assert identity is None and "org/model" in why and "not known" in why
    ref = tmp_path / "hub" / "models--org--model" / "refs" / "main"
    ref.parent.mkdir(parents=True)
    ref.write_text("0123abcd")
    identity, _ = runkey.run_identity(tiny_config, "hf", "org/model", dataset)
    assert identity["revisions"] == {"model:org/model": "0123abcd"} and identity["devices"] == ["cpu"]


def test_a_stored_run_is_restored_with_its_training_log(tmp_path):
    cache = stored(tmp_path)
    out, said = tmp_path / "out.json", []
    assert runcache.restore(cache, out, log=said.append)["max_steps"] == 5
    assert out.read_bytes() == (tmp_path / "first.json").read_bytes()
    assert "restored from the run cache" in said[0] and "| [hf x 5] training" in said[1]


def test_an_entry_holding_another_jobs_run_is_refused_and_set_aside(tmp_path):
    """One key's entry and digest copied over another's (the digest checks out): the run it holds is not the job's
    backend, steps and seed, so it is refused in one line, set aside, and the job trains."""
    cache = stored(tmp_path, make_stats("cb_paged", 5, seed=3408))
    said = []
    this_job = job(tmp_path, run={"backend": "hf", "max_steps": 5, "seed": 3407})
    assert runcache.restore(this_job, tmp_path / "out.json", log=said.append) is None
    assert not (tmp_path / "out.json").exists() and not runcache.entry("k", cache.cache).exists()
    assert "it holds the run cb_paged x 5 (seed 3408), not this job's hf x 5 (seed 3407)" in said[0]
    assert "set aside" in said[0] and "training instead" in said[0]
    stored(tmp_path, make_stats("hf", 5, seed=3407))
    assert runcache.restore(this_job, tmp_path / "out.json", log=said.append)["backend"] == "hf"


def test_an_entry_asked_with_other_settings_is_refused(tmp_path):
    """The run an entry holds was asked for with the grpo settings it records: another study's (another learning
    rate) is refused, naming the setting; the study's own is restored."""
    run = make_stats("hf", 5)
    run["requested_grpo"] = {"learning_rate": 1.0e-3, "seed": 3407}
    stored(tmp_path, run)
    said = []
    this_job = job(tmp_path, requested={"learning_rate": 5.0e-4, "seed": 3407})
    assert runcache.restore(this_job, tmp_path / "out.json", log=said.append) is None
    assert "learning_rate 0.001 where this study asks 0.0005" in said[0]
    run["requested_grpo"] = this_job.requested
    stored(tmp_path, run)
    assert runcache.restore(this_job, tmp_path / "out.json", log=said.append)["backend"] == "hf"


def test_a_job_snakemake_was_told_to_rerun_does_not_restore(tmp_path):
    stored(tmp_path)
    assert runcache.restore(job(tmp_path, restore_allowed=False), tmp_path / "out.json") is None


def test_the_switch_turns_the_cache_off(tmp_path, monkeypatch):
    args = {"log": None, "run_cache": True, "config": {}, "backend": "hf", "model_path": "m", "dataset": {},
            "code": "c", "inputs": [], "out": "o.json"}
    monkeypatch.setenv(runcache.SWITCH_ENV, "off")
    assert runcache.for_job(args, {}).key is None
    monkeypatch.delenv(runcache.SWITCH_ENV)
    assert runcache.for_job({**args, "run_cache": False}, {}).key is None


def edited(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("what, tamper, reason", [
    ("rewards edited", lambda p: edited(p, lambda d: [s.update(reward=s["reward"] + 5) for s in d["steps"]]),
     "does not match the digest written with it"),
    ("digest removed", lambda p: p.with_suffix(".sha256").unlink(), "it has no digest"),
    ("truncated", lambda p: p.write_text(p.read_text()[:200]), "does not match the digest"),
])
def test_a_tampered_entry_is_refused_in_one_line_and_set_aside(tmp_path, what, tamper, reason):
    cache = stored(tmp_path)
    entry = runcache.entry("k", cache.cache)
    tamper(entry)
    said = []
    assert runcache.restore(cache, tmp_path / "out.json", log=said.append) is None
    assert len(said) == 1 and reason in said[0] and "training instead" in said[0] and "\n" not in said[0]
    assert not entry.exists() and list(cache.cache.glob("k.json.refused-*"))  # set aside, not deleted
    assert not (tmp_path / "out.json").exists()


def test_an_entry_whose_wall_time_disagrees_with_its_steps_is_refused_even_with_a_matching_digest(tmp_path):
    cache = stored(tmp_path)
    entry = runcache.entry("k", cache.cache)
    edited(entry, lambda d: d.update(train_wall_s=0.5))  # the steps sum to 6.5 s
    entry.with_suffix(".sha256").write_text(hashlib.sha256(entry.read_bytes()).hexdigest() + "\n")
    said = []
    assert runcache.restore(cache, tmp_path / "out.json", log=said.append) is None
    assert "its steps took 6.500 s but train_wall_s is 0.500 s" in said[0]


def test_a_run_the_report_reads_is_checked_for_consistency_too(tmp_path):
    data = make_stats("hf", 5)
    data.update(train_wall_s=0.5)
    path = tmp_path / "grpo_hf_5.json"
    path.write_text(json.dumps(data))
    with pytest.raises(stats.StatsError, match="train_wall_s is 0.500 s"):
        stats.check_consistent(stats.load(path), path)


# --- A full disk, for real: the train job's writes go to a tmpfs too small to hold them ----------------------

def in_full_disk(tmp_path, script: str, *full: str, size="4k") -> subprocess.CompletedProcess:
    """`script` (Python) run with each folder of `full` a tmpfs of `size`, in a mount namespace of its own (as
    root, or as a user namespace's root where the kernel lets users make one)."""
    mounts = " && ".join(f"mkdir -p {d} && mount -t tmpfs -o size={size} tmpfs {d}" for d in full)
    namespace = ["unshare", "--mount"] + ([] if os.getuid() == 0 else ["--map-root-user"])
    return subprocess.run([*namespace, "sh", "-c", f'{mounts} && exec "$0" -c "$1"', sys.executable, script],
                          cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


KEEP = """
import sys
sys.path[:0] = {path!r}
from pathlib import Path
from grpo_equivalence.study import runcache
from helpers import make_stats
log = Path("logs/train.log"); log.parent.mkdir(exist_ok=True); log.write_text("[hf x 5] training\\n")
job = runcache.JobCache(key={key!r}, why="", restore_allowed=True, cache=Path("cache"), log_file=log)
runcache.keep(job, make_stats("hf", 60), Path("stats/grpo_hf_60.json"))  # about 40 kB
"""


@pytest.fixture
def keep_script():
    return lambda key="k": KEEP.format(path=sys.path[:3], key=key)


def test_a_full_stats_disk_keeps_the_run_in_the_cache_and_the_next_job_restores_it(tmp_path, keep_script):
    result = in_full_disk(tmp_path, keep_script(), "stats")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "stats/grpo_hf_60.json could not be written (No space left on device)" in line
    assert "kept in cache/k.json" in line and "rerun snakemake" in line
    assert not list((tmp_path / "stats").glob("*")), "a .partial or truncated file stayed behind"
    restored = runcache.restore(job(tmp_path), tmp_path / "out.json", log=lambda s: None)
    assert restored == stats.load(tmp_path / "out.json") and restored["max_steps"] == 60


def test_with_the_cache_full_too_the_run_goes_to_the_logs_folder_and_is_restored_from_there(tmp_path, keep_script):
    result = in_full_disk(tmp_path, keep_script(), "stats", "cache")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    rescued = tmp_path / "logs" / "rescued" / "k.json"
    assert f"kept in {rescued.relative_to(tmp_path)}" in result.stderr and rescued.exists()
    out = tmp_path / "out.json"
    assert runcache.restore(job(tmp_path), out, log=lambda s: None)["max_steps"] == 60
    assert runcache.entry("k", tmp_path / "cache").exists()  # back in the cache, where it belongs


def test_with_every_place_full_the_statistics_are_printed_to_stderr(tmp_path, keep_script, monkeypatch):
    monkeypatch.setenv(runcache.RESCUE_ENV, str(tmp_path / "rescue"))
    result = in_full_disk(tmp_path, keep_script(), "stats", "cache", "rescue")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    printed, error = result.stderr.rsplit("\n", 2)[0], result.stderr.strip().splitlines()[-1]
    assert json.loads(printed[printed.index("{"):])["max_steps"] == 60
    assert "its statistics are printed above: save them as stats/grpo_hf_60.json" in error


def test_a_report_written_over_a_full_disk_leaves_the_old_one_whole(tmp_path):
    script = f"""
import sys
sys.path[:0] = {sys.path[:3]!r}
from pathlib import Path
from grpo_equivalence import cli
Path("out/report.md").write_text("# the report of yesterday")
try:
    cli._write("x" * 100_000, "out/report.md", force=True)
except SystemExit as error:
    print(error, file=sys.stderr)
print(Path("out/report.md").read_text(), sorted(p.name for p in Path("out").iterdir()))
"""
    result = in_full_disk(tmp_path, script, "out")
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "out/report.md could not be written (No space left on device); the file there is unchanged" in line
    assert result.stdout.strip() == "# the report of yesterday ['report.md']"  # whole, and no .partial beside it


def test_a_run_rescued_to_memory_is_restored_in_its_own_checkout_only(tmp_path, monkeypatch):
    """A run rescued to a memory-backed folder (its own disk full) comes back into the checkout it was trained in;
    another checkout of the same user, whatever its key, never sees it: each has a folder of its own there."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    monkeypatch.chdir(one)
    mine = [str(f) for f in runcache.rescue_folders(None)]
    monkeypatch.chdir(two)
    theirs = [str(f) for f in runcache.rescue_folders(None)]
    assert mine and theirs and not set(mine) & set(theirs)
    assert all(f.startswith(("/run/user/", "/dev/shm/")) for f in mine)
    folder = runcache._private_folder(Path(mine[-1]))
    if folder is not None:  # /dev/shm where this machine has one
        assert folder.is_dir() and not folder.stat().st_mode & 0o077 and not folder.parent.stat().st_mode & 0o077
        folder.rmdir()
