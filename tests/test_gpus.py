"""GPU leases with a configured device list instead of real GPUs, and real concurrent processes."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_equivalence.runtime import gpus, leasefolder, quietlock

# Each job records which device it saw and when it held it.
JOB = "import os, sys, time; t = time.time(); time.sleep(float(sys.argv[2])); " \
      "open(sys.argv[1], 'a').write(f\"{os.environ['CUDA_VISIBLE_DEVICES']} {t} {time.time()}\\n\")"


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    def env(devices):
        monkeypatch.setenv(gpus.DEVICES_ENV, devices)
        monkeypatch.setenv(leasefolder.LOCK_DIR_ENV, str(tmp_path / "locks"))
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
        return dict(os.environ)
    return env


def start_job(env, record, seconds, count=1):
    return subprocess.Popen([sys.executable, "-m", "grpo_equivalence.runtime.gpus", str(count), "--", sys.executable, "-c", JOB,
                             str(record), str(seconds)], env=env, stderr=subprocess.PIPE, text=True)


def intervals(record):
    rows = [line.split() for line in record.read_text().splitlines()]
    return [(devices, float(start), float(end)) for devices, start, end in rows]


def test_concurrent_jobs_never_share_a_device_and_extra_requests_wait(fake_gpus, tmp_path):
    env = fake_gpus("0,1")
    record = tmp_path / "record"
    jobs = [start_job(env, record, 0.6) for _ in range(5)]
    stderr = [job.communicate()[1] for job in jobs]
    assert all(job.returncode == 0 for job in jobs)
    held = intervals(record)
    assert len(held) == 5 and {d for d, _, _ in held} == {"0", "1"}
    for i, (dev_a, start_a, end_a) in enumerate(held):
        for dev_b, start_b, end_b in held[i + 1:]:
            if dev_a == dev_b:
                assert end_a <= start_b or end_b <= start_a, "two jobs held one device at once"
    # Five jobs on two devices: at most two at any moment, so some had to wait.
    events = sorted([(s, 1) for _, s, _ in held] + [(e, -1) for _, _, e in held])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 2
    assert any("waiting for 1 GPU(s) with room for a whole GPU" in err for err in stderr)


def test_a_killed_jobs_lease_comes_back(fake_gpus, tmp_path):
    env = fake_gpus("0")
    record = tmp_path / "record"
    holder = start_job(env, record, 60)
    time.sleep(1.5)  # it holds the only device now
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    started = time.time()
    follower = start_job(env, record, 0.1)
    assert follower.wait() == 0
    (devices, start, _), = intervals(record)
    assert devices == "0" and start - started < 5


def test_multi_gpu_lease_is_all_or_nothing(fake_gpus, tmp_path):
    fake_gpus("0,1,2")
    first = gpus.acquire(2)
    try:
        assert first.devices == ["0", "1"] and first.source == "lease"
        second = gpus.acquire(1)
        assert second.devices == ["2"]
        gpus.release(second)
    finally:
        gpus.release(first)
    again = gpus.acquire(3)
    assert again.devices == ["0", "1", "2"]
    gpus.release(again)


def test_respects_the_users_cuda_visible_devices(monkeypatch, tmp_path):
    monkeypatch.delenv(gpus.DEVICES_ENV, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv(leasefolder.LOCK_DIR_ENV, str(tmp_path))
    with gpus.leased(1, log=lambda s: None) as lease:
        assert lease.devices == ["2"] and os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"


def overlaps(held):
    """Pairs of records that held one device at the same time."""
    return [(a, b) for i, a in enumerate(held) for b in held[i + 1:]
            if a[0] == b[0] and not (a[2] <= b[1] or b[2] <= a[1])]


def test_a_job_submitted_to_slurm_takes_the_devices_slurm_gave_it(fake_gpus, tmp_path):
    """The SLURM executor runs each job under a `snakemake --target-jobs ...` process inside the job's own
    allocation. Stand-in for that process: a script named snakemake with those arguments (the real executor
    is exercised by test_slurm)."""
    env = fake_gpus("0,1")
    env.update(SLURM_JOB_ID="42", CUDA_VISIBLE_DEVICES="1")
    wrapper = tmp_path / "bin" / "snakemake"
    wrapper.parent.mkdir()
    wrapper.write_text("import subprocess, sys\nsys.exit(subprocess.run(sys.argv[3:]).returncode)\n")
    record = tmp_path / "record"
    job = subprocess.run([sys.executable, str(wrapper), "--target-jobs", "train:backend=hf",
                          sys.executable, "-m", "grpo_equivalence.runtime.gpus", "1", "--", sys.executable, "-c", JOB,
                          str(record), "0"], env=env, capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    (devices, _, _), = intervals(record)
    assert devices == "1" and not (tmp_path / "locks").exists()  # SLURM's device, no lease taken


def test_local_jobs_inside_an_allocation_lease_distinct_devices(fake_gpus, tmp_path):
    """Snakemake started in an `salloc` shell runs its jobs locally with SLURM_JOB_ID set: they share the
    allocation's devices, so they must lease them like any local jobs."""
    env = fake_gpus("0,1")
    env.update(SLURM_JOB_ID="42", SLURM_JOB_GPUS="0,1")
    record = tmp_path / "record"
    jobs = [start_job(env, record, 1.0) for _ in range(3)]
    assert all(job.wait() == 0 for job in jobs)
    held = intervals(record)
    assert len(held) == 3 and {d for d, _, _ in held} == {"0", "1"}
    assert not overlaps(held), "two jobs held one device at once"


def test_a_lease_folder_of_another_user_is_refused(fake_gpus, tmp_path):
    """Another local user who creates the folder first could hold, delete or redirect the leases."""
    env = fake_gpus("0")
    folder = tmp_path / "locks"
    folder.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(folder, 12345, 12345)  # a real folder of another uid
    else:
        folder.chmod(0o777)  # not ours to chown: open to others is refused the same way
    job = start_job(env, tmp_path / "record", 0)
    err = job.communicate()[1]
    assert job.returncode != 0 and not (tmp_path / "record").exists()
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"GPU lease folder {folder}" in err and leasefolder.LOCK_DIR_ENV in err


def test_a_linked_lock_file_is_never_followed(fake_gpus, tmp_path):
    """A link planted at gpu-0.lock must not make the job write into the file it points at."""
    env = fake_gpus("0")
    folder = tmp_path / "locks"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victims_file"
    victim.write_text("precious\n")
    (folder / "gpu-0.lock").symlink_to(victim)
    job = start_job(env, tmp_path / "record", 0)
    err = job.communicate()[1]
    assert job.returncode != 0 and victim.read_text() == "precious\n"
    assert len(err.strip().splitlines()) == 1 and "gpu-0.lock" in err and "Traceback" not in err


def test_a_linked_lease_folder_is_refused(fake_gpus, tmp_path):
    env = fake_gpus("0")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "locks").symlink_to(tmp_path / "elsewhere")
    job = start_job(env, tmp_path / "record", 0)
    err = job.communicate()[1]
    assert job.returncode != 0 and "is a link" in err and not list((tmp_path / "elsewhere").iterdir())


def test_the_default_lease_folder_is_private(monkeypatch):
    monkeypatch.delenv(leasefolder.LOCK_DIR_ENV, raising=False)
    folder = leasefolder.lock_dir()
    info = os.lstat(folder)
    assert info.st_uid == os.getuid() and info.st_mode & 0o777 == 0o700


def test_too_few_visible_devices_is_an_error_not_a_wait(fake_gpus):
    fake_gpus("0")
    with pytest.raises(RuntimeError, match="needs 2 GPU.*1 are visible"):
        gpus.acquire(2)


def test_cpu_jobs_take_no_lease(fake_gpus):
    fake_gpus("0")
    assert gpus.acquire(0).source == "none"


def test_longest_expected_job_first(tmp_path):
    from grpo_equivalence.analysis.stats import write
    from grpo_equivalence.study import schedule
    from helpers import make_stats

    # Unmeasured backends: more steps first.
    assert schedule.priority("hf", 30, tmp_path) > schedule.priority("hf", 10, tmp_path)
    # Measured: a backend with 2 s steps at 10 steps outranks one with 0.1 s steps at 30.
    slow, fast = make_stats("slow", 10, wall=lambda i: 2.0), make_stats("fast", 30, wall=lambda i: 0.1)
    slow["train_wall_s"], fast["train_wall_s"] = 25.0, 5.0  # 5 s and 2 s of start-up overhead
    write(tmp_path / "grpo_slow_10.json", slow)
    write(tmp_path / "grpo_fast_30.json", fast)
    assert schedule.priority("slow", 10, tmp_path) > schedule.priority("fast", 30, tmp_path)
    assert schedule.expected_seconds("fast", 60, tmp_path) == pytest.approx(2.0 + 60 * 0.1)


def test_jobs_that_see_different_tmpdirs_share_one_lease_folder(tmp_path, monkeypatch):
    """Snakemake sets each job's TMPDIR from its `tmpdir` resource: the leases must not follow it, or two
    workflows would both take the same GPU. Device names unique to this test keep real leases apart."""
    monkeypatch.delenv(leasefolder.LOCK_DIR_ENV, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    devices = f"test{os.getpid()}a,test{os.getpid()}b"
    record = tmp_path / "record"
    jobs = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        env = dict(os.environ, TMPDIR=str(tmp_path / name), **{gpus.DEVICES_ENV: devices})
        jobs.append(start_job(env, record, 1.0))
    assert all(job.wait() == 0 for job in jobs)
    held = intervals(record)
    (dev_a, start_a, end_a), (dev_b, start_b, end_b) = held
    assert dev_a != dev_b or end_a <= start_b or end_b <= start_a, "two jobs held one device at once"
    for device in devices.split(","):
        (leasefolder.lock_dir() / f"gpu-{device}.lock").unlink(missing_ok=True)


# --- Several jobs on one GPU --------------------------------------------------------------------------------------

# A packed job records, in one line (jobs write to one file at once), its device, when it held it, and what it asked
PACKED_JOB = "import os, sys, time; t = time.time(); time.sleep(float(sys.argv[2])); " \
             "open(sys.argv[1], 'a').write(f\"{os.environ['CUDA_VISIBLE_DEVICES']} {t} {time.time()} {' '.join(sys.argv[3:])}\\n\")"


def start_packed(env, record, seconds, *, memory_gb=None, share=0.0, jobs_per_gpu=1, run="", count=1):
    """A job that asks for a share of a GPU (a whole one without memory_gb) and records its lease."""
    options = ["--jobs-per-gpu", str(jobs_per_gpu), "--run", run, "--share", str(share)]
    if memory_gb is not None:
        options += ["--memory-gb", str(memory_gb)]
    return subprocess.Popen([sys.executable, "-m", "grpo_equivalence.runtime.gpus", str(count), *options, "--", sys.executable,
                             "-c", PACKED_JOB, str(record), str(seconds), run, str(memory_gb or 0), str(share)],
                            env={**env, "GRPO_EQUIVALENCE_LEASE_RECORD": str(record) + ".leases"},
                            stderr=subprocess.PIPE, text=True)


def held_intervals(record):
    """(device, start, end, run, memory asked, share asked) per job."""
    rows = []
    for line in record.read_text().splitlines():
        device, start, end, run, memory, share = line.split()
        rows.append((device, float(start), float(end), run, float(memory), float(share)))
    return rows


def peak_use(rows, capacity):
    """Per device, the most jobs and the most memory held at one moment."""
    peaks = {}
    for device in {r[0] for r in rows}:
        mine = [r for r in rows if r[0] == device]
        for _, start, _, _, _, _ in mine:  # the load is highest just after some job started
            present = [r for r in mine if r[1] <= start < r[2]]
            jobs, memory = len(present), sum(r[4] + r[5] * capacity for r in present)
            old = peaks.get(device, (0, 0.0))
            peaks[device] = (max(old[0], jobs), max(old[1], memory))
    return peaks


@pytest.mark.slow
def test_packing_never_oversubscribes_a_devices_memory_or_slots(fake_gpus, tmp_path, monkeypatch):
    env = fake_gpus("0,1")
    env[gpus.MEMORY_ENV] = "10"
    record = tmp_path / "record"
    asks = [(3, 0.0), (4, 0.0), (6, 0.0), (1, 0.3), (2, 0.0), (5, 0.0)] * 3  # GB, and a vLLM-like share
    jobs = [start_packed(env, record, 0.8, memory_gb=gb, share=share, jobs_per_gpu=3, run=f"job{i}")
            for i, (gb, share) in enumerate(asks)]
    assert all(job.wait() == 0 for job in jobs), [job.stderr.read() for job in jobs]
    rows = held_intervals(record)
    assert len(rows) == len(asks)
    peaks = peak_use(rows, capacity=10)
    for device, (most_jobs, most_gb) in peaks.items():
        assert most_jobs <= 3, f"GPU {device} held {most_jobs} jobs at once, more than jobs_per_gpu"
        assert most_gb <= 10 * gpus.USABLE + 1e-9, f"GPU {device} held {most_gb} GB of its 10 GB at once"
    assert max(jobs for jobs, _ in peaks.values()) > 1, "nothing was packed"
    leases = [json.loads(line) for line in (tmp_path / "record.leases").read_text().splitlines()]
    assert all(not lease["whole"] and lease["jobs_per_gpu"] == 3 for lease in leases)
    assert any(lease["shared_with"] for lease in leases)  # they saw each other


def test_a_whole_gpu_job_is_alone_and_later_packed_jobs_do_not_starve_it(fake_gpus, tmp_path):
    env = fake_gpus("0")
    env[gpus.MEMORY_ENV] = "10"
    record = tmp_path / "record"
    first = [start_packed(env, record, 1.5, memory_gb=2, jobs_per_gpu=4, run=f"early{i}") for i in range(2)]
    while not _holding(env, 2):
        time.sleep(0.05)
    whole = start_packed(env, record, 0.3, run="speed")  # the device to itself
    waiting = ""
    while "waiting for 1 GPU(s) with room for a whole GPU" not in waiting:  # its reservation is taken by then
        waiting += whole.stderr.readline()
    late = [start_packed(env, record, 0.3, memory_gb=2, jobs_per_gpu=4, run=f"late{i}") for i in range(2)]
    assert all(job.wait() == 0 for job in first + [whole] + late)
    rows = {r[3]: r for r in held_intervals(record)}
    speed = rows["speed"]
    others = [r for name, r in rows.items() if name != "speed"]
    assert all(r[2] <= speed[1] or speed[2] <= r[1] for r in others), "a job shared the whole-GPU job's device"
    assert all(rows[f"late{i}"][1] >= speed[2] for i in range(2)), "a later packed job went ahead of the waiting one"
    (alone,) = [lease for lease in map(json.loads, (tmp_path / "record.leases").read_text().splitlines()) if lease["whole"]]
    assert alone["shared_with"] == []


def _holding(env, count) -> bool:
    """Whether `count` jobs hold slots in the lease folder now."""
    folder = Path(env[leasefolder.LOCK_DIR_ENV])
    held = 0
    for path in folder.glob("gpu-*.slot-*.lock"):
        with open(path) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held += 1
    return held >= count


def test_a_job_asking_for_more_memory_than_a_gpu_has_is_an_error_not_a_wait(fake_gpus, monkeypatch):
    fake_gpus("0")
    monkeypatch.setenv(gpus.MEMORY_ENV, "10")
    with pytest.raises(RuntimeError, match="more than a GPU has"):
        gpus.acquire(1, gpus.Need(whole=False, memory_gb=12, jobs_per_gpu=2))


QUIET_PROBE = """
import sys, time
from grpo_equivalence.runtime import quietlock
with quietlock.quiet([sys.argv[1]], measuring=sys.argv[2] == "measure"):
    print(f"in {time.time()}", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _quiet_probe(path, mode, hold_s=0.0):
    return subprocess.Popen([sys.executable, "-c", QUIET_PROBE, str(path), mode, str(hold_s)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(Path(gpus.__file__).parents[2])})


def test_loading_jobs_overlap_but_never_a_vllm_engines_start_and_it_is_not_starved(tmp_path):
    """Jobs that load or end (shared quiet lock) go on beside each other; an engine start (exclusive) waits for
    them, and while it waits, a job that comes to load after it waits behind it (the turnstile)."""
    path = tmp_path / "gpu-0.quiet"
    loading = leasefolder.open_file(path)
    fcntl.flock(loading, fcntl.LOCK_SH)  # another job is loading
    began = time.time()
    with quietlock.quiet([str(path)]):  # a second job loads at once beside it
        assert time.time() - began < 1
        probe = leasefolder.open_file(path)
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no engine could start now
        probe.close()
    engine = _quiet_probe(path, "measure", 0.5)
    time.sleep(1.5)  # the engine start waits, holding the turnstile
    late = _quiet_probe(path, "load")
    time.sleep(1.0)
    released = time.time()
    loading.close()
    assert engine.wait(30) == 0 and late.wait(30) == 0
    engine_in, late_in = (float(next(line for line in p.stdout if line.startswith("in ")).split()[1])
                          for p in (engine, late))
    assert released <= engine_in < late_in  # the engine first, the late loader after it ended
    assert late_in - engine_in >= 0.45
