"""Nothing lost, nothing misleading: interrupts with real processes and signals, the run cache, and the
network policy of a local study.

Snakemake runs the tiny study in a scratch folder; the tests signal the Snakemake process alone (not its
process group), as a user's `kill` or a scheduler would.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from grpo_equivalence import runcache, stats
from helpers import SMALL_ROLLOUT_CHECK, make_stats

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
    config = yaml.safe_load((ROOT / "studies" / "tiny.yaml").read_text())
    config.update(backends=["hf", "cb_paged"], rollout_check=SMALL_ROLLOUT_CHECK)  # the workflow's, not a backend's
    config.update(changes)
    path = workdir / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start(workdir: Path, env: dict, *args: str) -> subprocess.Popen:
    """Snakemake on the study of `workdir`, in the background, with SIGINT at its default (a process started
    in the background by a shell would ignore it)."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "results/grpo_equivalence.md", "--cores", "2", "--config", f"study={workdir / 'study.yaml'}", *args]
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
def interrupted(tmp_path_factory):
    """SIGINT to Snakemake while train jobs run, without any HF_*_OFFLINE variable and with every network
    call logged; then the same command with --rerun-incomplete, as Snakemake advises."""
    workdir = tmp_path_factory.mktemp("interrupted")
    hook = tmp_path_factory.mktemp("audit")
    (hook / "sitecustomize.py").write_text(AUDIT_HOOK)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")])),
               NETWORK_AUDIT_LOG=str(workdir / "network.log"))
    study(workdir, steps=[4, 8], replicates={"reference": 1, "others": 1})
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
        assert "restored from the run cache" in log and "] training" not in log, log[-2000:]
    for name, content in interrupted["finished"].items():
        assert (workdir / "results/stats" / name).read_bytes() == content  # the very runs, none trained again
    assert (workdir / "results/grpo_equivalence.md").exists()


def test_a_local_study_makes_no_network_call_whatever_the_environment(interrupted):
    log = interrupted["workdir"] / "network.log"
    assert not log.exists(), log.read_text()[:3000]


def test_train_jobs_stop_when_snakemake_is_killed(tmp_path):
    """SIGKILL leaves Snakemake no chance to stop its jobs: they must notice and stop themselves, or they
    would train on as orphans (holding a GPU) beside a rerun that --unlock allows."""
    study(tmp_path, backends=["hf"], reference="hf", steps=[200], replicates={"reference": 1, "others": 1})
    proc = start(tmp_path, dict(os.environ))
    (log,) = wait_until_training(tmp_path, proc)
    jobs = train_processes(tmp_path)
    assert jobs, "the running train job was not found"
    proc.kill()
    proc.wait()
    while any(alive(pid) for pid in jobs):
        time.sleep(0.2)
    assert "the workflow that started this job (snakemake" in log.read_text()
    assert not (tmp_path / "results/stats/grpo_hf_200.json").exists()  # stopped, not finished


def test_run_cache_key_follows_settings_code_and_input_content(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights").write_bytes(b"abc")
    base = runcache.key({"lr": 1}, "code1", [model])
    assert base == runcache.key({"lr": 1}, "code1", [model])
    assert base != runcache.key({"lr": 2}, "code1", [model])
    assert base != runcache.key({"lr": 1}, "code2", [model])
    (model / "weights").write_bytes(b"abd")
    assert base != runcache.key({"lr": 1}, "code1", [model])


def test_run_cache_never_restores_a_damaged_or_partial_run(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "out.json"
    whole = tmp_path / "whole.json"
    stats.write(whole, make_stats("hf", 5))
    runcache.store("k", whole, cache)
    assert runcache.restore("k", out, cache)["max_steps"] == 5 and out.read_bytes() == whole.read_bytes()
    partial = make_stats("hf", 5)
    partial["steps"] = partial["steps"][:3]
    stats.write(runcache.entry("k", cache), partial)
    assert runcache.restore("k", tmp_path / "other.json", cache) is None
    runcache.entry("k", cache).write_text("{truncated")
    assert runcache.restore("k", tmp_path / "other.json", cache) is None
    assert runcache.restore("absent", tmp_path / "other.json", cache) is None
