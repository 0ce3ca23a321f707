"""Rule rollout_check: one backend samples the check's prompts at fixed weights, on a GPU of its own or a share of one, and the
trainer scores every sampled token (grpo_equivalence.rollout)."""

from pathlib import Path

from grpo_equivalence import gpushare, jobs, rollout, runcache, train

a = jobs.arguments()
jobs.stop_with_workflow()
a["config"].update(a.get("resolved", {}))  # the reward files and chat template where this job finds them
train.check_packages(a["backend"], a["config"])  # before waiting for a GPU: a missing package fails at once
runcache.use_compile_caches(a)
with gpushare.leased_for_job(a):
    import torch

    torch.set_num_threads(a["threads"])
    rollout.check(a["config"], a["backend"], model_path=a["model_path"], dataset=a["dataset"], out=Path(a["out"]))
