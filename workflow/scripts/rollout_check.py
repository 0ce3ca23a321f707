"""Rule rollout_check: one backend samples the check's prompts at fixed weights, on a GPU of its own or a share of one, and the
trainer scores every sampled token (grpo_equivalence.checks.rollout)."""

from pathlib import Path

from grpo_equivalence.checks import rollout
from grpo_equivalence.runtime import jobs
from grpo_equivalence.study import gpushare, runcache
from grpo_equivalence.training import session

a = jobs.arguments()
jobs.stop_with_workflow()
a["config"].update(a.get("resolved", {}))  # the reward files and chat template where this job finds them
session.check_packages(a["backend"], a["config"])  # before waiting for a GPU: a missing package fails at once
runcache.use_compile_caches(a)
with gpushare.leased_for_job(a):
    import torch

    torch.set_num_threads(a["threads"])
    rollout.check(a["config"], a["backend"], model_path=a["model_path"], dataset=a["dataset"], out=Path(a["out"]))
