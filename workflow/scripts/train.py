"""Rule train: one GRPO run of a backend and step count, on a GPU of its own, written as a statistics file.

A run finished before with exactly these settings, code and inputs (an interrupted workflow whose outputs
Snakemake marked incomplete) is restored from the run cache instead of trained again.
"""

import time
from pathlib import Path

from grpo_equivalence import gpus, jobs, runcache, train

a = jobs.arguments()
jobs.stop_with_workflow()
out = Path(a["out"])
key = runcache.key({k: a[k] for k in ("config", "backend", "steps", "model_path", "dataset")}, a["code"], a["inputs"])
restored = runcache.restore(key, out)
if restored is not None:
    finished = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(restored.get("train_finished_at", 0)))
    print(f"[{a['backend']} x {a['steps']}] restored from the run cache ({runcache.entry(key)}, trained until "
          f"{finished}): settings, code and inputs are those of this job, so it is not trained again")
else:
    train.check_packages(a["backend"])  # before waiting for a GPU: a missing package fails at once
    with gpus.leased(a["config"]["gpus_per_train_job"]) as lease:
        import torch

        torch.set_num_threads(a["threads"])
        train.run(a["config"], a["backend"], a["steps"], model_path=a["model_path"], dataset=a["dataset"], out=out,
                  gpu_lease=lease.record())
    runcache.store(key, out)
