"""Rule compare: a candidate run against the reference run of the same step count, step by step."""

from pathlib import Path

from grpo_equivalence import jobs, stats
from grpo_equivalence.compare import compare

a = jobs.arguments()
Path(a["out"]).write_text(stats.to_json(compare(stats.load(a["reference"]), stats.load(a["candidate"]))))
