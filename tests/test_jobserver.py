"""The job server of a local CPU study (grpo_equivalence.runtime.jobserver), with real processes: a served job gets
its own arguments, folder, streams, environment, signals and exit status; a job it cannot run as its own process
would runs in that process instead."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

# A job script: hands itself over as every workflow script does (jobs.arguments), then says where it ran.
JOB = '''
import os, sys, time
from grpo_equivalence.runtime import handover
handover.hand_over(int(os.environ["WORKFLOW_PID"]))
print("ran", os.getpid(), handover.serving, os.getcwd(), sys.argv[1:], os.environ.get("OMP_NUM_THREADS"), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[2]))
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The server of a "workflow" that is this test process, with the environment its jobs get."""
    from grpo_equivalence.runtime import jobserver

    folder = tmp_path_factory.mktemp("jobserver")
    (folder / "job.py").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(WORKFLOW_PID=str(os.getpid()),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    process = jobserver.start(os.getpid(), folder / "jobserver.log", offline=True, env=env)
    deadline = time.time() + 120
    while "imported" not in (folder / "jobserver.log").read_text():
        assert process.poll() is None and time.time() < deadline, (folder / "jobserver.log").read_text()
        time.sleep(0.2)
    yield {"folder": folder, "process": process, "log": folder / "jobserver.log", "env": env}
    process.terminate()
    assert process.wait(timeout=30) == 0


def job(server, *args, env=None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(server["folder"] / "job.py"), *args], cwd=server["folder"],
                            env={**server["env"], **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def test_a_served_job_has_its_own_arguments_folder_streams_and_exit_status(server):
    proc = job(server, "run", "3", env={"OMP_NUM_THREADS": "1"})  # Snakemake sets the threads per job
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert "[job server] running in the workflow's job server" in out
    ran = next(line for line in out.splitlines() if line.startswith("ran")).split(" ", 4)
    assert int(ran[1]) != proc.pid and ran[2] == "True"  # a fork of the server, not the job's own process
    assert ran[3] == str(server["folder"]) and "['run', '3']" in ran[4] and ran[4].endswith(" 1")
    assert err == "to stderr\n"


def test_a_job_whose_shell_prompt_differs_is_served(server):
    """An activated venv exports PS1; the shell that runs a job's command passes another on: still served."""
    proc = job(server, "run", "0", env={"PS1": "(.venv) $ ", "PROMPT_COMMAND": "true"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "[job server] running in the workflow's job server" in out


def test_a_job_whose_environment_differs_runs_in_its_own_process(server):
    proc = job(server, "run", "0", env={"SOMETHING_ELSE": "1"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "not used (its environment differs from the workflow's in SOMETHING_ELSE)" in out
    ran = next(line for line in out.splitlines() if line.startswith("ran")).split(" ", 4)
    assert int(ran[1]) == proc.pid and ran[2] == "False"
    assert "refused" in server["log"].read_text()


def running_job(server, proc) -> int:
    """The served job's own process id, once it runs."""
    line = proc.stdout.readline()
    while not line.startswith("ran"):
        assert line, proc.stderr.read()
        line = proc.stdout.readline()
    return int(line.split()[1])


def gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX":
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.1)
    return False


def test_a_signal_to_the_jobs_process_reaches_the_job_and_its_end_is_the_jobs(server):
    proc = job(server, "sleep", "0")
    served = running_job(server, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # ended as a job's own process ends by SIGTERM
    assert gone(served)


def test_a_served_job_stops_when_its_process_is_killed(server):
    proc = job(server, "sleep", "0")
    served = running_job(server, proc)
    proc.kill()  # nothing can pass SIGKILL on: the job must notice itself
    proc.wait()
    assert gone(served), "the served job ran on after its own process was killed"
