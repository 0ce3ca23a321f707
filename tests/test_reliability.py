"""Nothing lost, nothing misleading: interrupts with real processes and signals, the run cache, and the
network policy of a local study.

Snakemake runs the tiny study in a scratch folder; the tests signal the Snakemake process alone (not its
process group), as a user's `kill` or a scheduler would.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, copy_tiny, tiny_yaml
from grpo_equivalence.study import runkey
from helpers import SMALL_ROLLOUT_CHECK

pytestmark = pytest.mark.workflow

# Logs every network call of any Python process that has this folder on its path (sitecustomize runs at
# start-up), except connections to local sockets.
AUDIT_HOOK = '''
import os, socket, sys
_LOG = os.environ.get("NETWORK_AUDIT_LOG")

def _hook(event, args):
    if event == "socket.connect" and getattr(args[0], "family", None) == socket.AF_UNIX:
        return
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "http.client.connect"):
        with open(_LOG, "a") as f:
            f.write(f"{os.getpid()} {' '.join(sys.argv[:2])[:100]}: {event} {str(args)[:160]}\\n")

if _LOG:
    sys.addaudithook(_hook)
'''


def study(workdir: Path, **changes) -> Path:
    config = tiny_yaml()
    # the workflow's, not a backend's; the trainer check's jobs are tested in test_workflow and test_slurm
    config.update(backends=["hf", "cb_paged"], rollout_check=SMALL_ROLLOUT_CHECK, trainer_check=False)
    config.update(changes)
    path = workdir / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def trained(log: str) -> bool:
    """Whether a train job's log says it trained (not counting the original log a restored run prints back,
    each of its lines behind "| ")."""
    return any("] training" in line for line in log.splitlines() if not line.startswith("| "))


def start(workdir: Path, env: dict, *args: str, target="results/grpo_equivalence.md") -> subprocess.Popen:
    """Snakemake on the study of `workdir`, in the background, with SIGINT at its default (a process started
    in the background by a shell would ignore it)."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
           target, "--cores", "2", "--config", f"study={workdir / 'study.yaml'}", *args]
    return subprocess.Popen(cmd, env=env, stdout=open(workdir / "snakemake.out", "a"), stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_until_training(workdir: Path, proc: subprocess.Popen) -> list[Path]:
    """The logs of the train jobs that have started training, once there is one (or the workflow ended)."""
    while proc.poll() is None:
        training = [log for log in (workdir / "results/logs/train").glob("*.log") if "] training" in log.read_text()]
        if training:
            return training
        time.sleep(0.2)
    raise AssertionError(f"snakemake ended before any training:\n{(workdir / 'snakemake.out').read_text()[-3000:]}")


def train_processes(workdir: Path) -> list[int]:
    """Process ids of the train jobs running in `workdir` (python workflow/scripts/train.py ...)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = (proc / "cwd").resolve()
        except OSError:
            continue
        if len(argv) > 1 and Path(argv[0]).name.startswith("python") and argv[1].endswith("workflow/scripts/train.py") \
                and cwd == workdir.resolve():
            found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, tiny_results):
    """SIGINT to Snakemake while train jobs run, without any HF_*_OFFLINE variable and with every network
    call logged; then the same command with --rerun-incomplete, as Snakemake advises."""
    workdir = tmp_path_factory.mktemp("interrupted")
    hook = tmp_path_factory.mktemp("audit")
    (hook / "sitecustomize.py").write_text(AUDIT_HOOK)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")])),
               NETWORK_AUDIT_LOG=str(workdir / "network.log"))
    study(workdir, steps=[4, 8], replicates={"reference": 1, "others": 1})
    copy_tiny(tiny_results, workdir)
    proc = start(workdir, env)
    training = wait_until_training(workdir, proc)
    proc.send_signal(signal.SIGINT)
    interrupted_rc = proc.wait()
    finished = {p.name: p.read_bytes() for p in (workdir / "results/stats").glob("grpo_*.json")}
    plan = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
                           "results/grpo_equivalence.md", "--config", f"study={workdir / 'study.yaml'}", "-n"],
                          capture_output=True, text=True, env=env)
    rerun = start(workdir, env, "--rerun-incomplete")
    rerun_rc = rerun.wait()
    return {"workdir": workdir, "training": training, "interrupted_rc": interrupted_rc, "finished": finished,
            "plan": plan.stdout + plan.stderr, "rerun_rc": rerun_rc}


def test_sigint_lets_running_train_jobs_finish_but_snakemake_marks_them_incomplete(interrupted):
    assert interrupted["interrupted_rc"] != 0
    assert interrupted["finished"], "no train job finished after SIGINT"
    for content in interrupted["finished"].values():
        assert len(json.loads(content)["steps"]) == json.loads(content)["max_steps"]  # whole runs
    assert "incomplete" in interrupted["plan"].lower()  # what the rerun-incomplete below is about


def test_rerun_incomplete_restores_finished_runs_instead_of_training_them(interrupted):
    workdir = interrupted["workdir"]
    assert interrupted["rerun_rc"] == 0, (workdir / "snakemake.out").read_text()[-3000:]
    incomplete = [name for name in interrupted["finished"] if f"results/stats/{name}" in interrupted["plan"]]
    assert incomplete, interrupted["plan"][-2000:]  # Snakemake listed the finished runs as incomplete
    for name in incomplete:
        log = (workdir / "results/logs/train" / name.removeprefix("grpo_").replace(".json", ".log")).read_text()
        assert "restored from the run cache" in log and not trained(log), log[-2000:]
    for name, content in interrupted["finished"].items():
        assert (workdir / "results/stats" / name).read_bytes() == content  # the very runs, none trained again
    assert (workdir / "results/grpo_equivalence.md").exists()


def test_a_local_study_makes_no_network_call_whatever_the_environment(interrupted):
    log = interrupted["workdir"] / "network.log"
    assert not log.exists(), log.read_text()[:3000]


def test_a_process_that_ended_counts_as_gone_reaped_or_a_zombie():
    """What the train jobs' watch reads of the Snakemake process: a start time while it lives, none once it has
    ended, also while it is a zombie that its parent has not reaped (its /proc entry outlives it)."""
    from grpo_equivalence.runtime import jobs

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert jobs._start_time(proc.pid) is not None
    proc.kill()
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.05)
    assert jobs._start_time(proc.pid) is None  # a zombie
    proc.wait()
    assert jobs._start_time(proc.pid) is None  # reaped


def test_train_jobs_stop_when_snakemake_is_killed_even_unreaped(tmp_path, tiny_into):
    """SIGKILL leaves Snakemake no chance to stop its jobs: they must notice and stop themselves, or they
    would train on as orphans (holding a GPU) beside a rerun that --unlock allows. Here its parent kills it
    without reaping it, so it stays a zombie, whose /proc entry looks like a live process: gone all the same."""
    tiny_into(tmp_path)
    study(tmp_path, backends=["hf"], reference="hf", steps=[200], replicates={"reference": 1, "others": 1})
    proc = start(tmp_path, dict(os.environ), target="results/stats/grpo_hf_200.json")  # the train job alone
    (log,) = wait_until_training(tmp_path, proc)
    jobs = train_processes(tmp_path)
    assert jobs, "the running train job was not found"
    proc.kill()  # and not reaped until the jobs are gone
    while any(alive(pid) for pid in jobs):
        time.sleep(0.2)
    assert Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # still a zombie
    proc.wait()
    assert "the workflow that started this job (snakemake" in log.read_text()
    assert not (tmp_path / "results/stats/grpo_hf_200.json").exists()  # stopped, not finished


# --- The run cache on a user's own model and data ---------------------------------------------------------------

RUN = "results/stats/grpo_hf_4.json"
LOG = "results/logs/train/hf_4.log"


def own_study(workdir: Path, primed: dict) -> None:
    """The tiny study on a model folder and a data file of the user's (copies of the primed tiny model and its
    data), one run of hf at 4 steps."""
    shutil.copytree(primed["model"], workdir / "my-model")
    shutil.copy(primed["dataset"]["data_files"], workdir / "data.jsonl")
    study(workdir, backends=["hf"], reference="hf", steps=[4], replicates={"reference": 1, "others": 1},
          model=str(workdir / "my-model"), dataset={"path": "json", "data_files": str(workdir / "data.jsonl")})


def run(workdir: Path, *args: str, env=None, prefix=(), target=RUN) -> subprocess.CompletedProcess:
    """Snakemake on the run of `own_study` alone (no summaries, no report: only the train job matters here)."""
    return subprocess.run([*prefix, sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
                           str(workdir), target, "--cores", "2", "--config", f"study={workdir / 'study.yaml'}", *args],
                          capture_output=True, text=True, env=env)


def rewards(workdir: Path) -> list:
    return [step["reward"] for step in json.loads((workdir / RUN).read_text())["steps"]]


@pytest.fixture(scope="module")
def own(tmp_path_factory, primed):
    workdir = tmp_path_factory.mktemp("own")
    own_study(workdir, primed)
    first = run(workdir)
    assert first.returncode == 0, first.stderr[-3000:]
    return workdir


def test_a_changed_local_data_file_retrains_and_changes_the_run(own):
    before, log_before = rewards(own), (own / LOG).read_text()
    assert trained(log_before)
    data = own / "data.jsonl"
    saved = data.read_text()
    data.write_text(re.sub(r'"solution": "\d+"', '"solution": "999"', saved))
    try:
        again = run(own)
        assert again.returncode == 0, again.stderr[-3000:]
        log = (own / LOG).read_text()
        assert trained(log) and "restored from the run cache" not in log, log[-2000:]
        assert rewards(own) != before  # every answer is now wrong: check_answer scores differ
    finally:
        data.write_text(saved)


def test_an_input_replaced_with_an_older_modification_time_still_reruns(own, tmp_path):
    """`cp -p` of other content over the data file: by Snakemake's times nothing changed; by the file system's change
    time it did, and the run cache, keyed on content, trains it anew."""
    data = own / "data.jsonl"
    saved = data.read_text()
    other = tmp_path / "other.jsonl"
    other.write_text(re.sub(r'"solution": "\d+"', '"solution": "888"', saved))  # content no run has had
    os.utime(other, (1_000_000, 1_000_000))  # 1970: older than every output
    subprocess.run(["cp", "-p", str(other), str(data)], check=True)
    try:
        again = run(own)
        assert again.returncode == 0, again.stderr[-3000:]
        log = (own / LOG).read_text()
        assert trained(log) and "restored from the run cache" not in log, log[-2000:]  # by Snakemake's times: nothing
    finally:
        data.write_text(saved)


def test_forcerun_trains_although_the_cache_holds_the_run(own):
    result = run(own, "--forcerun", "train")
    assert result.returncode == 0, result.stderr[-3000:]
    log = (own / LOG).read_text()
    assert "snakemake was told to rerun this job: training, not restoring" in log and trained(log)


def test_a_missing_output_is_restored_with_its_original_training_log(own):
    original = (own / LOG).read_text()
    (own / RUN).unlink()
    result = run(own)
    assert result.returncode == 0, result.stderr[-3000:]
    log = (own / LOG).read_text()
    assert "restored from the run cache" in log and not trained(log)
    printed_back = [line.removeprefix("| ") for line in log.splitlines() if line.startswith("| ")]
    assert printed_back == original.splitlines()[:len(printed_back)] and any("] training" in line for line in printed_back)


def test_run_cache_false_trains_a_run_the_cache_holds(own):
    (own / RUN).unlink()
    result = run(own, "run_cache=false")  # one more --config pair
    assert result.returncode == 0, result.stderr[-3000:]
    log = (own / LOG).read_text()
    assert "not using the run cache: the run cache is off" in log and trained(log)


def test_a_tampered_cache_entry_is_refused_and_the_run_trained_again(own):
    entries = sorted((own / "results/cache/runs").glob("*.json"), key=lambda p: p.stat().st_mtime)
    entry = [p for p in entries if p.name != runkey.DIGESTS][-1]  # the entry of the data as it is now
    honest = rewards(own)
    data = json.loads(entry.read_text())
    for step in data["steps"]:
        step["reward"] += 5
    entry.write_text(json.dumps(data))
    (own / RUN).unlink()
    result = run(own)
    assert result.returncode == 0, result.stderr[-3000:]
    log = (own / LOG).read_text()
    assert f"run cache entry {entry.relative_to(own)} refused: its content does not match the digest" in log
    assert trained(log) and max(rewards(own)) < max(honest) + 5


def test_a_cache_entry_trained_with_another_studys_settings_is_refused(own):
    """An entry of the same backend, steps and seed trained with another learning rate (another study's), with a
    digest that checks out, placed under this study's key: refused, naming the setting, and the run trained."""
    import hashlib

    entries = sorted((own / "results/cache/runs").glob("*.json"), key=lambda p: p.stat().st_mtime)
    entry = [p for p in entries if p.name != runkey.DIGESTS][-1]
    data = json.loads(entry.read_text())
    data["requested_grpo"]["learning_rate"] = 1.0e-3
    text = json.dumps(data)
    entry.write_text(text)
    entry.with_suffix(".sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    (own / RUN).unlink()
    result = run(own)
    assert result.returncode == 0, result.stderr[-3000:]
    log = (own / LOG).read_text()
    assert "refused: it was trained with other settings than this study's (learning_rate 0.001 where this study " \
           "asks 0.0005" in log, log[-2000:]
    assert trained(log)


def test_a_full_disk_at_the_end_of_training_loses_nothing(own):
    """results/stats is a 4 kB tmpfs while the job trains: it fails naming the path, and the next run restores
    the run it finished instead of training it again."""
    namespace = ["unshare", "--mount"] + ([] if os.getuid() == 0 else ["--map-root-user"])
    mount = ["sh", "-c", 'mount -t tmpfs -o size=4k tmpfs "$0" && exec "$@"', str(own / "results/stats")]
    (own / RUN).unlink()  # the tmpfs hides it from the job, not from this test
    full = run(own, "--forcerun", "train", prefix=[*namespace, *mount])
    assert full.returncode != 0
    log = (own / LOG).read_text()
    assert trained(log) and f"{RUN} could not be written (No space left on device)" in log, log[-3000:]
    assert "the finished run is kept in results/cache/runs/" in log and "Traceback" not in log
    # on the console: the job's last line and where its log is, not its settings (they are in a file, @FILE)
    last = log.strip().splitlines()[-1]
    assert f"job failed (status 1): {last}" in full.stderr and f"(the whole log: {LOG})" in full.stderr
    assert '"learning_rate"' not in full.stderr and "@.snakemake/grpo-equivalence/args/" in full.stderr
    again = run(own)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "restored from the run cache" in (own / LOG).read_text()


def test_a_bad_statistics_file_is_one_line_on_the_console_naming_the_field_and_the_fix(own):
    """A statistics file edited after its job wrote it: the job that reads it fails, and the console says which
    file, step and field, and what to do, in one line (not the exception's module path nor a traceback)."""
    saved = (own / RUN).read_text()
    data = json.loads(saved)
    key = next(k for k in data["steps"][1]["metrics"] if k.startswith("rewards/") and k.endswith("/mean"))
    data["steps"][1]["metrics"][key] = "abc"
    (own / RUN).write_text(json.dumps(data))
    try:
        result = run(own, target="results/stats/grpo_hf_4.summary.json")
    finally:
        (own / RUN).write_text(saved)
    assert result.returncode != 0
    said = [line for line in result.stderr.splitlines() if line.startswith("job failed")]
    assert said == [f'job failed (status 1): StatsError: {RUN}: step 2: metrics.{key} is str "abc", not a number '
                    "(null where not logged; 'NaN', 'Infinity', '-Infinity' for a non-finite value); fix the file, "
                    "or delete it: the workflow restores its run from the run cache (or trains it again) when an "
                    "output needs it"], said
    assert "Traceback" not in result.stderr and "(the whole log: results/logs/summarise/hf_4.log)" in result.stderr


FLOODING_JOB = """
import sys
sys.path.insert(0, {src!r})
if {unfailing}:
    from grpo_equivalence.runtime import jobs
    jobs.unfailing_streams()
for i in range(3000):
    print("a line of the trainer's logs " * 4)  # some 400 kB into a 16 kB disk
print("and a warning", file=sys.stderr)
open({out!r}, "w").write("finished")
"""


@pytest.mark.parametrize("unfailing", [True, False])
def test_a_full_disk_under_the_jobs_log_loses_lines_not_the_job(tmp_path, unfailing):
    """A job's log on a disk that fills: the job runs to its end (and keeps its run), its log loses lines. Without the
    job's own streams, Python's fail it (the control: the test can fail)."""
    disk, out = tmp_path / "disk", tmp_path / "out.txt"
    disk.mkdir()
    (tmp_path / "job.py").write_text(FLOODING_JOB.format(src=str(ROOT / "src"), unfailing=unfailing, out=str(out)))
    namespace = ["unshare", "--mount"] + ([] if os.getuid() == 0 else ["--map-root-user"])
    command = f'mount -t tmpfs -o size=16k tmpfs "{disk}" && exec "{sys.executable}" "{tmp_path / "job.py"}" > ' \
              f'"{disk}/job.log" 2>&1'
    result = subprocess.run([*namespace, "sh", "-c", command], capture_output=True, text=True)
    if unfailing:
        assert result.returncode == 0 and out.read_text() == "finished", result.stderr[-2000:]
    else:
        assert result.returncode != 0 and not out.exists()


def test_a_study_named_with_a_space_runs_its_jobs(tmp_path, primed):
    """A study's folder holds its name (results/NAME): with a space in it, every job failed with "(its log is
    empty)", its log path split by the shell. A job of such a study trains and logs."""
    own_study(tmp_path, primed)
    config = yaml.safe_load((tmp_path / "study.yaml").read_text())
    config.pop("results", None)
    config["name"] = "my study"
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(config))
    done = run(tmp_path, "run_cache=false", target="results/my study/stats/grpo_hf_4.json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert trained((tmp_path / "results/my study/logs/train/hf_4.log").read_text())


def test_a_job_started_as_snakemake_is_killed_stops_before_any_work(tmp_path):
    """kill -9 of Snakemake just after it started a job: the job, still importing, finds no Snakemake among its
    ancestors any more (pid 1 adopted it) and trained to its end, unwatched. The workflow's mark in the environment
    names it whatever the job's ancestors: a job whose workflow is gone stops at once, and one whose workflow lives
    is watched."""
    from grpo_equivalence.runtime import jobs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    marked = None
    while marked is None or jobs._start_time(gone.pid) is not None:
        marked = marked or f"{__import__('socket').gethostname()}:{gone.pid}:{jobs._start_time(gone.pid)}"
        time.sleep(0.01)
    gone.wait()
    script = ("from grpo_equivalence.runtime import jobs; import time; print('watching', jobs.stop_with_workflow(), "
              "flush=True); time.sleep(0.5); print('worked')")
    env = {**os.environ, jobs.WORKFLOW_ENV: marked, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 143 and "is gone: stopping before any work" in done.stdout, done.stdout + done.stderr
    assert "worked" not in done.stdout
    env[jobs.WORKFLOW_ENV] = jobs.workflow_mark()  # this test's process: alive
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and f"watching {os.getpid()}" in done.stdout and "worked" in done.stdout
