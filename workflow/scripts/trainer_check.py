"""Rule trainer_check: one backend's trainer computes, from the saved batch at fixed weights, what one training step
does (grpo_equivalence.checks.trainer), on a GPU of its own or a share of one."""

import json
from pathlib import Path

from grpo_equivalence.checks import trainer
from grpo_equivalence.study.gpujob import gpu_job

with gpu_job() as a:
    trainer.check(a["config"], a["backend"], model_path=a["model_path"], dataset=a["dataset"],
                  batch=json.loads(Path(a["batch"]).read_text()), max_steps=a["max_steps"], out=Path(a["out"]),
                  tensors=Path(a["tensors"]))
