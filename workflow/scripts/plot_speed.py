"""Rule plot_speed: median step time and peak memory of every backend and step count."""

import json
from pathlib import Path

from grpo_equivalence import jobs, plots

a = jobs.arguments()
plots.speed_memory([json.loads(Path(p).read_text()) for p in a["summaries"]], a["reference"], Path(a["out"]))
