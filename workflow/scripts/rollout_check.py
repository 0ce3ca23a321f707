"""Rule rollout_check: one backend samples the check's prompts at fixed weights, on a GPU of its own, and the
trainer scores every sampled token (grpo_equivalence.rollout)."""

from pathlib import Path

from grpo_equivalence import gpus, jobs, rollout, train

a = jobs.arguments()
jobs.stop_with_workflow()
train.check_packages(a["backend"])  # before waiting for a GPU: a missing package fails at once
with gpus.leased(a["config"]["gpus_per_train_job"]):
    import torch

    torch.set_num_threads(a["threads"])
    rollout.check(a["config"], a["backend"], model_path=a["model_path"], dataset=a["dataset"], out=Path(a["out"]))
