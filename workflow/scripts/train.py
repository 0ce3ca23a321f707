"""Rule train: one GRPO run of a backend and step count, on a GPU of its own or a share of one (gpushare), written as a statistics file.

A run finished before with exactly these settings, code, inputs, packages and GPU model (an interrupted
workflow whose outputs Snakemake marked incomplete) is restored from the run cache instead of trained again
(grpo_equivalence.study.runcache says what the key covers and how to bypass it).
"""

from pathlib import Path

from grpo_equivalence.analysis import stats
from grpo_equivalence.runtime import jobs
from grpo_equivalence.study import gpushare, runcache
from grpo_equivalence.training import parallel, session, train

a = jobs.arguments()
jobs.stop_with_workflow()
out = Path(a["out"])
cache = runcache.for_job(a, {k: a[k] for k in ("config", "backend", "steps", "model_path", "dataset")})
if cache.key is None:
    print(f"[{a['backend']} x {a['steps']}] not using the run cache: {cache.why}", flush=True)
elif not cache.restore_allowed:
    print(f"[{a['backend']} x {a['steps']}] snakemake was told to rerun this job: training, not restoring",
          flush=True)
a["config"].update(a.get("resolved", {}))  # the reward files and chat template where this job finds them
if runcache.restore(cache, out) is None:
    session.check_packages(a["backend"], a["config"])  # before waiting for a GPU: a missing package fails at once
    runcache.use_compile_caches(a)
    keep = lambda path, result: runcache.keep(cache, result, path)  # noqa: E731
    with gpushare.leased_for_job(a) as lease:
        if parallel.processes(a["config"]) > 1:  # a process per leased GPU; this one keeps the bookkeeping
            result = parallel.launch(a["config"], a["backend"], a["steps"], model_path=a["model_path"],
                                     dataset=a["dataset"], study=a.get("study", "study"), adapter=a.get("adapter"),
                                     threads=a["threads"])
            result["environment"]["gpu_lease"] = lease.record() if callable(lease.record) else lease.record
            keep(out, result)
        else:
            import torch

            torch.set_num_threads(a["threads"])
            train.run(a["config"], a["backend"], a["steps"], model_path=a["model_path"], dataset=a["dataset"], out=out,
                      gpu_lease=lease.record, study=a.get("study", "study"), adapter=a.get("adapter"), write=keep)
stats.record_digest(out)  # what this job wrote: a later edit by hand is named in the report
