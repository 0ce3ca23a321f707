"""What every job that loads the study's model to check it does first (rollout check, trainer batch, trainer check):
its arguments, the study's files where this job finds them, its packages checked before it waits for a GPU, the
backend's compile caches, then its GPU lease (or share of one) and its threads for the block."""

import contextlib

from ..runtime import jobs
from ..training import session
from . import gpushare, runcache


@contextlib.contextmanager
def gpu_job():
    """Yields the job's arguments (jobs.arguments) while it holds its GPU."""
    a = jobs.arguments()
    jobs.stop_with_workflow()
    a["config"].update(a.get("resolved", {}))  # the reward files and chat template where this job finds them
    session.check_packages(a["backend"], a["config"])  # before waiting for a GPU: a missing package fails at once
    runcache.use_compile_caches(a)
    with gpushare.leased_for_job(a):
        import torch

        torch.set_num_threads(a["threads"])
        yield a
