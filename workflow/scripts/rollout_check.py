"""Rule rollout_check: one backend samples the check's prompts at fixed weights, on a GPU of its own or a share of one, and the
trainer scores every sampled token (grpo_equivalence.checks.rollout)."""

from pathlib import Path

from grpo_equivalence.checks import rollout
from grpo_equivalence.study.gpujob import gpu_job

with gpu_job() as a:
    rollout.check(a["config"], a["backend"], model_path=a["model_path"], dataset=a["dataset"], out=Path(a["out"]))
