"""What every job of the workflow shares: its arguments, its network policy, and its tie to the workflow.

A rule runs `python workflow/scripts/STAGE.py @SETTINGS @IO` through `shell:` (files of JSON, args_file).
SETTINGS are what the job's result depends on (Snakemake compares them and reruns the job when they change); IO are
the paths, threads and process settings it runs with (Snakemake does not compare params derived from paths). Rules use
`shell:` rather than `script:` because Snakemake reruns a `script:` job whenever the script's modification
time changes, as it does for every file of a fresh clone; a shell command is compared by its text, and each
rule's `code` param hashes the script's content with the package modules it imports (codedeps).
"""

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

# Set for every job: no usage report leaves the machine, whatever the study.
NO_TELEMETRY = {"HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1"}
# Set for a study whose model and data are local (io `offline`): no hub look-up at all, not even the
# `datasets` download counter or a model-info call, whatever the user's environment says.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def arguments(argv=None) -> dict:
    """SETTINGS and IO merged, with the job's process environment set before any library is imported. A job's own
    call (its command line's arguments) first hands the job to the workflow's job server where one runs it."""
    own = argv is None
    argv = sys.argv[1:] if own else argv
    if len(argv) != 2:
        sys.exit(f"usage: python {Path(sys.argv[0]).name} SETTINGS IO (each JSON or @FILE of it; a job of the "
                 f"workflow: run it through snakemake)")
    args = {**json.loads(_text(argv[0])), **json.loads(_text(argv[1]))}
    if own:
        from . import handover

        handover.hand_over(workflow_process())  # a CPU study's local job: run in the workflow's job server
    apply_environment(offline=bool(args.get("offline")))
    if own:
        unfailing_streams()
    return args


class LogStream:
    """A job's standard output or error, its log: written straight to the file descriptor, and a write that fails (a
    full disk) loses those lines, never the job. Python's own stream raised OSError from inside the trainer's
    print(logs) after the last step, and again when it flushed at exit (status 120), which lost finished runs."""

    encoding, errors, lost = "utf-8", "replace", 0

    def __init__(self, fd: int):
        self._fd = fd

    def write(self, text: str) -> int:
        data = text.encode(self.encoding, self.errors)
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError:
            self.lost += 1
        return len(text)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def writable(self) -> bool:
        return True

    closed = False


def unfailing_streams() -> None:
    """The job's stdout and stderr as LogStreams (what Python buffered so far written first, where it can be)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, LogStream) or stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
        setattr(sys, name, LogStream(stream.fileno()))


def _text(argument: str) -> str:
    """A job's argument: JSON, or @FILE holding it (args_file)."""
    return Path(argument[1:]).read_text() if argument.startswith("@") else argument


def args_file(text: str, folder) -> str:
    """@FILE for a job's JSON argument: a file named after its content, in `folder`, written once. The command a job
    runs stays a line long (Snakemake prints it when the job fails), and the name still changes with the content,
    which is what Snakemake compares to rerun a job whose settings changed."""
    import hashlib

    path = Path(folder) / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text)
        partial.replace(path)
    return f"@{path}"


def last_error(log: str, status: int) -> None:
    """Why a job failed, on the console: its log's last line (the exception Python printed last, or the job's own
    message), and where the whole log is; exits with the job's status."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    said = lines[-1][:400] if lines else "(its log is empty)"
    # "grpo_equivalence.analysis.stats.StatsError: ..." -> "StatsError: ...": the message is what names the fix
    said = re.sub(r"^(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_]\w*: )", "", said)
    print(f"job failed (status {status}): {said}\n  (the whole log: {log})", file=sys.stderr)
    sys.exit(status or 1)


def apply_environment(*, offline: bool) -> None:
    """What every job sets in its environment before any library reads it (the job server too, before it imports)."""
    os.environ.update(NO_TELEMETRY)
    if offline:
        os.environ.update(OFFLINE)


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _start_time(pid: int) -> str | None:
    """When `pid` started (to tell it from a later process given the same id), or None once it is gone: ended,
    or a zombie, which has ended but whose parent (a script that killed Snakemake, say) has not reaped it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if len(fields) < 20 or fields[0] in ("Z", "X"):  # zombie or dead: its /proc entry outlives the process
        return None
    return fields[19]


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def _is_snakemake(pid: int) -> bool:
    # `snakemake ...`, `python .../bin/snakemake ...` or `python -m snakemake ...`
    return any(Path(arg).name == "snakemake" for arg in _argv(pid)[:3])


def _ancestors():
    pid = _parent(os.getpid())
    while pid and pid > 1:
        yield pid
        pid = _parent(pid)


def under_slurm_executor() -> bool:
    """Whether this job is one that Snakemake submitted to SLURM (its own allocation, with its own devices),
    rather than a job of a local Snakemake that happens to run inside an allocation (an `salloc` shell, an
    sbatch script, an `srun --pty` shell). A submitted job runs under a `snakemake --target-jobs ...` process
    that executes that one job (started by sbatch, then through `srun`, so it need not descend from the
    workflow's own Snakemake); a local Snakemake runs its shell jobs itself."""
    if not os.environ.get("SLURM_JOB_ID"):
        return False
    return any("--target-jobs" in _argv(pid) for pid in _ancestors() if _is_snakemake(pid))


# Set by the workflow before its jobs start (host:pid:start time): a job started just before Snakemake was killed
# finds no Snakemake among its ancestors any more (it was given to pid 1), and would otherwise train to its end
WORKFLOW_ENV = "GRPO_EQUIVALENCE_WORKFLOW"


def workflow_mark() -> str:
    """This process, as the jobs it starts find it: its host, pid and start time."""
    import socket

    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def _marked() -> tuple[int, str | None] | None:
    """The workflow process the environment names, where it runs on this host: (pid, start time)."""
    import socket

    host, _, rest = os.environ.get(WORKFLOW_ENV, "").partition(":")
    pid, _, started = rest.partition(":")
    if not pid.isdigit() or host != socket.gethostname():  # a cluster node: the workflow runs elsewhere
        return None
    return int(pid), started


def workflow_process() -> int | None:
    """The Snakemake process this job runs under (its nearest ancestor running snakemake), if any."""
    return next((pid for pid in _ancestors() if _is_snakemake(pid)), None)


def stop_with_workflow(log=print, poll_s: float = 1.0) -> int | None:
    """Ends this job when the Snakemake process that started it is gone (killed with SIGKILL, say).

    Snakemake then cannot stop its jobs, which would run on as orphans holding a GPU for minutes to hours,
    beside a rerun that `--unlock` allows. A job run by hand has no such process and is not watched.
    Returns the watched process id.
    """
    marked = _marked()
    pid = marked[0] if marked else workflow_process()
    if pid is None:
        return None
    started = marked[1] if marked else _start_time(pid)

    def watch():
        while started is not None and _start_time(pid) == started:  # a recycled pid has another start time
            time.sleep(poll_s)
        log(f"the workflow that started this job (snakemake, pid {pid}) is gone: stopping, so that no orphan "
            f"job holds its GPU; rerun snakemake to run this job again")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # a library that handles SIGTERM itself had its chance to stop cleanly
        os._exit(128 + signal.SIGTERM)

    if _start_time(pid) != started:  # gone before this job looked: stop now, before any work
        log(f"the workflow that started this job (snakemake, pid {pid}) is gone: stopping before any work; rerun "
            f"snakemake to run this job again")
        sys.exit(128 + signal.SIGTERM)
    threading.Thread(target=watch, name="stop-with-workflow", daemon=True).start()
    return pid


if __name__ == "__main__":  # a rule's command when its job fails: python -m grpo_equivalence.runtime.jobs LOG STATUS
    last_error(sys.argv[1], int(sys.argv[2]))
