"""Rule plot_speed: median step time and peak memory of every backend and step count."""

import json
from pathlib import Path

from grpo_equivalence.report import plots
from grpo_equivalence.runtime import jobs

a = jobs.arguments()
plots.speed_memory([json.loads(Path(p).read_text()) for p in a["summaries"]], a["reference"], Path(a["out"]))
