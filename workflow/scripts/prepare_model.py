"""Rule prepare_model: the tiny Qwen3 of the study's `tiny` settings, saved with save_pretrained."""

from pathlib import Path

from grpo_equivalence.runtime import jobs
from grpo_equivalence.training import tiny

a = jobs.arguments()
t = a["tiny"]
tiny.save_model(Path(a["out"]), hidden_size=t["hidden_size"], num_layers=t["num_layers"], seed=t["seed"])
