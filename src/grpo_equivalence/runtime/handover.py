"""A job handed to the workflow's job server (grpo_equivalence.runtime.jobserver): the job's side, and the messages
both sides exchange over the server's socket."""

import json
import os
import signal
import socket
import sys
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
POLL_S = 0.5

serving = False  # True in the server's fork that runs a job: that job's jobs.arguments() must not hand it over again


def address(workflow_pid: int) -> str:
    """The server's socket: in Linux's abstract namespace (no file to leave behind, no path-length limit), named
    after the user and the Snakemake process; the server answers only its own user (SO_PEERCRED)."""
    return f"\0grpo-equivalence-jobs-{os.getuid()}-{workflow_pid}"


def send(sock, message: dict, fds=()) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def receive(sock, with_fds: int = 0):
    """One message (a JSON line), and the file descriptors sent with it; None where the peer closed first."""
    data, fds = b"", []
    while not data.endswith(b"\n"):
        if with_fds and not fds:
            chunk, got, _, _ = socket.recv_fds(sock, 65536, with_fds)
            fds = got
        else:
            chunk = sock.recv(65536)
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        data += chunk
    return json.loads(data), fds


# --- The job's side -------------------------------------------------------------------------------------------


def hand_over(workflow_pid: int | None) -> None:
    """Runs this job in the workflow's job server, where one listens and takes it, and exits with the job's status;
    returns where the job must run in this process."""
    if serving or workflow_pid is None:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address(workflow_pid))
    except OSError:
        sock.close()
        return  # no server: a GPU or cluster study, job_server false, or it is still importing
    request = {"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "executable": sys.executable,
               "path": sys.path}
    try:
        send(sock, request, fds=(0, 1, 2))
        reply, _ = receive(sock)
    except OSError:
        reply = None
    if reply is None or "pid" not in reply:
        why = reply.get("refused") if reply else "it ended"
        print(f"[job server] not used ({why}): the job runs in its own process", flush=True)
        sock.close()
        return
    child = reply["pid"]
    for number in SIGNALS:  # what Snakemake, a scheduler or a terminal sends this process, the job gets
        signal.signal(number, lambda signum, frame: os.kill(child, signum))
    status, _ = receive(sock)
    if status is None:  # the server ended first: wait for the job itself, which finishes on its own
        while alive(child):
            time.sleep(POLL_S)
        sys.stderr.write("[job server] ended before the job did: its exit status is unknown\n")
        os._exit(1)
    code = status["exit"]
    if code < 0:  # ended by a signal: so does this process, as the job's own process would have
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
