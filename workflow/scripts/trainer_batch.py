"""Rule trainer_batch: the reference samples the trainer check's one generation batch (grpo_equivalence.checks.trainer)."""

from pathlib import Path

from grpo_equivalence.checks import trainer
from grpo_equivalence.study.gpujob import gpu_job

with gpu_job() as a:
    trainer.sample_batch(a["config"], a["backend"], model_path=a["model_path"], dataset=a["dataset"], out=Path(a["out"]))
