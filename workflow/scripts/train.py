"""Rule train: one GRPO run of a backend and step count, on a GPU of its own, written as a statistics file.

A run finished before with exactly these settings, code, inputs, packages and GPU model (an interrupted
workflow whose outputs Snakemake marked incomplete) is restored from the run cache instead of trained again
(grpo_equivalence.runcache says what the key covers and how to bypass it).
"""

import sys
from pathlib import Path

from grpo_equivalence import gpus, jobs, runcache, train

a = jobs.arguments()
jobs.stop_with_workflow()
out = Path(a["out"])
cache = runcache.for_job(a, {k: a[k] for k in ("config", "backend", "steps", "model_path", "dataset")})
if cache.key is None:
    print(f"[{a['backend']} x {a['steps']}] not using the run cache: {cache.why}", flush=True)
elif not cache.restore_allowed:
    print(f"[{a['backend']} x {a['steps']}] snakemake was told to rerun this job: training, not restoring",
          flush=True)
if runcache.restore(cache, out) is None:
    train.check_packages(a["backend"])  # before waiting for a GPU: a missing package fails at once
    try:
        with gpus.leased(a["config"]["gpus_per_train_job"]) as lease:
            import torch

            torch.set_num_threads(a["threads"])
            train.run(a["config"], a["backend"], a["steps"], model_path=a["model_path"], dataset=a["dataset"],
                      out=out, gpu_lease=lease.record(), write=lambda path, result: runcache.keep(cache, result, path))
    except gpus.LeaseFolderError as error:
        sys.exit(f"error: {error}")
