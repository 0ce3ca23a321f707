"""Local jobs of a CPU study started from one interpreter that has imported torch, transformers, PEFT and TRL once.

A train job of the tiny study trains in about a second and spends some six seconds of CPU importing its libraries;
a study of 18 runs spends most of its time there. For a study that runs on CPUs and locally (`job_server`, on by
default; onstart in workflow/rules/train.smk), the workflow starts this server, which imports those libraries once,
with the environment every job gets, and then listens on a socket named after the Snakemake process. A job's script
calls `hand_over()` first (jobs.arguments does): where the server listens and the job's interpreter and environment
are the server's, the server forks a copy of itself that runs the script with the job's arguments, working folder,
standard streams and environment, and the job's own process waits for it, passes it every signal it receives and
exits with its status. Anywhere else (a GPU study, where Unsloth must be imported before transformers and CUDA must
not be set up before a fork; a cluster node; another interpreter or environment; no server yet) the job runs in its
own process as before. The job's log says which.

What a served job shares with its own process: arguments, environment (compared whole), working folder, streams,
signals, exit status, the watch that stops it with the workflow (jobs.stop_with_workflow: the server is Snakemake's
child), and a stop of its own when the job's process is gone. What differs: Snakemake's `benchmark:` file of a served
job measures the waiting process, not the work.
"""

import contextlib
import os
import signal
import socket
import sys
import time

from . import jobs
from .handover import POLL_S, SIGNALS, address, receive, send

# What the server imports before it listens: what the workflow's scripts import, the heaviest first
PRELOAD = ("torch", "transformers", "peft", "datasets", "trl", "pandas", "matplotlib", "jinja2", "yaml",
           "scipy.special")
# ... and the attributes of lazy modules that import the rest (TRL's trainers load on first use)
PRELOAD_ATTRIBUTES = (("trl", "GRPOTrainer"), ("trl", "GRPOConfig"), ("transformers", "AutoModelForCausalLM"),
                      ("peft", "LoraConfig"))
# What may differ between a job's environment and the server's: what Snakemake sets for each job (its threads for
# the linear-algebra libraries, its temporary folder) and what the shell running the job's command sets. The fork
# applies the first (torch's threads, Python's temporary folder); the libraries that read the others at import
# (OpenBLAS, MKL) do linear algebra no job of the workflow times or depends on.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
# A shell's prompt and terminal settings: a venv's activate exports its PS1, which the shell running a job's command
# does not pass on alike; nothing a job runs reads them
SHELL_ONLY = ("PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "COLUMNS", "LINES")
PER_JOB = frozenset((*THREAD_VARIABLES, *SHELL_ONLY, "TMPDIR", "TMP", "TEMPDIR", "TEMP", "PWD", "OLDPWD", "SHLVL", "_"))


def _differs(request: dict, environment: dict) -> str | None:
    """Why the server cannot run this job as its own process would, or None."""
    if request.get("executable") != sys.executable:
        return f"another interpreter ({request.get('executable')}; the server's is {sys.executable})"
    env = request.get("env") or {}
    changed = sorted(k for k in set(env) | set(environment) if env.get(k) != environment.get(k) and k not in PER_JOB)
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        return f"its environment differs from the workflow's in {shown}"
    return None


def _preload(log) -> None:
    import importlib

    began = time.perf_counter()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as error:  # a library this study's jobs do not use: they import what they need themselves
            log(f"not preloaded: {name} ({type(error).__name__}: {error})")
    for module, attribute in PRELOAD_ATTRIBUTES:
        try:
            getattr(sys.modules[module], attribute)
        except Exception as error:
            log(f"not preloaded: {module}.{attribute} ({type(error).__name__}: {error})")
    log(f"imported {', '.join(n for n in PRELOAD if n in sys.modules)} in {time.perf_counter() - began:.1f} s")


def _apply_per_job(env: dict) -> None:
    """What the libraries the server imported read from the environment once, read again from the job's."""
    import tempfile

    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    threads = env.get("OMP_NUM_THREADS", "")
    if "torch" in sys.modules and threads.isdigit() and int(threads) > 0:
        sys.modules["torch"].set_num_threads(int(threads))


def _run_job(request: dict, conn) -> int:
    """In the server's fork: becomes the job's process and runs its script; returns its exit status."""
    import runpy
    import threading

    from . import handover

    handover.serving = True
    for number in SIGNALS:
        signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _apply_per_job(request["env"])
    sys.argv = list(request["argv"])
    sys.path[:] = request["path"]

    def watch():  # the job's own process is gone (SIGKILL): nothing waits for this job any more
        with contextlib.suppress(OSError):  # reset, not ended: it died with the server's reply still unread
            conn.recv(1)
        print("[job server] the job's own process is gone: stopping", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="job-process-watch", daemon=True).start()
    print(f"[job server] running in the workflow's job server (pid {os.getppid()}), from its preloaded "
          f"interpreter", flush=True)
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as end:
        code = end.code
        if code is None:
            return 0
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            return 1
        return code
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    return 0


def serve(workflow_pid: int, log=print) -> int | None:
    """The server's loop, until the workflow is gone or SIGTERM; in a fork that runs a job, that job's exit status
    (the caller exits with it), else None."""
    import gc

    environment = dict(os.environ)  # the jobs' environment, before what jobs.arguments() adds to it
    started = jobs._start_time(workflow_pid)
    # Listening before importing: a job that starts meanwhile waits for the server (seconds) instead of importing
    # the same libraries itself, which would take those seconds of CPU from the server and the other jobs.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address(workflow_pid))
    listener.listen(64)
    log(f"listening for the jobs of snakemake (pid {workflow_pid})")
    jobs.apply_environment(offline="--offline" in sys.argv)
    _preload(log)
    gc.collect()
    gc.freeze()  # what is imported stays out of the forks' garbage collections, which would copy its pages
    listener.settimeout(POLL_S)
    waiting: dict[int, socket.socket] = {}  # a running job's pid: the connection of its own process
    stopping = []  # SIGTERM (the workflow's end): take no more jobs, but answer those that run
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    try:
        while not stopping and started is not None and jobs._start_time(workflow_pid) == started:
            _reap(waiting, log)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            try:
                request, fds = receive(conn, with_fds=3)
            except OSError:
                conn.close()
                continue
            if request is None:
                conn.close()
                continue
            uid = _peer_uid(conn)
            why = (f"a process of user {uid}" if uid != os.getuid() else None) or _differs(request, environment)
            if why is not None or len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                send(conn, {"refused": why or "no standard streams"})
                conn.close()
                log(f"refused {' '.join(request.get('argv', [])[:1])}: {why}")
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in waiting.values():
                    other.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                return _run_job(request, conn)
            for fd in fds:
                os.close(fd)
            waiting[pid] = conn
            with contextlib.suppress(OSError):  # its own process gone already: the job stops itself, reaped as any
                send(conn, {"pid": pid})
            log(f"job {pid}: {' '.join(request['argv'][:1])}")
    finally:
        listener.close()
    log("the workflow has ended: stopping" if stopping else "the workflow is gone: stopping")
    while waiting:  # the jobs' own processes still wait for their status
        _reap(waiting, log)
        time.sleep(POLL_S)
    return None


def _peer_uid(conn) -> int:
    import struct

    credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]


def _reap(waiting: dict, log=None) -> None:
    while waiting:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if log is not None:
            cpu = usage.ru_utime + usage.ru_stime
            log(f"job {pid} ended ({os.waitstatus_to_exitcode(status)}), {cpu:.1f} s of CPU")
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                send(conn, {"exit": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass
            conn.close()


# The rules whose jobs import TRL: the server pays for its own start (one import) from two of them on
HEAVY_RULES = ("train", "rollout_check", "prime", "trainer_batch", "trainer_check")
WORTH_FROM = 2


def worth_starting(pending_rules) -> bool:
    """Whether a workflow that will run jobs of these rules (one name per job) gains from a server."""
    return sum(rule in HEAVY_RULES for rule in pending_rules) >= WORTH_FROM


def start(workflow_pid: int, log_path, *, offline: bool, env: dict | None = None):
    """Starts the server for the Snakemake process `workflow_pid` (this one), in a session of its own (a terminal's
    Ctrl-C reaches the jobs' own processes, which pass it on, not the server); returns its Popen."""
    import subprocess
    from pathlib import Path

    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    # -c: the server imports its modules by their names, as the jobs' scripts do
    command = [sys.executable, "-c", f"from {__name__} import main; main()", str(workflow_pid),
               *(["--offline"] if offline else [])]
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, env=env)
    _started.append(server)
    return server


_started = []  # the servers this process started


def stop() -> None:
    """Stops the servers this process started, once the jobs they run have ended (the workflow's end)."""
    while _started:
        server = _started.pop()
        server.terminate()
        server.wait()


def main() -> None:
    workflow_pid = int(sys.argv[1])

    def log(message):
        print(f"[job server {os.getpid()}] {message}", flush=True)

    code = serve(workflow_pid, log)
    if code is not None:  # the fork that ran a job
        _exit(code)


def _exit(code: int) -> None:
    """Ends the job's fork as the interpreter ends a job's own process (its threads joined, its at-exit handlers run,
    its streams flushed), without tearing down every object the server imported: that would write to each of their
    memory pages, which the fork shares with the server until then, and cost a second of CPU a job."""
    import atexit
    import threading

    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

