"""Rule prepare_data: the seeded arithmetic problems of the tiny study, one JSON object per line."""

from pathlib import Path

from grpo_equivalence.runtime import jobs
from grpo_equivalence.training import tiny

a = jobs.arguments()
t = a["tiny"]
rows = tiny.problems(t["problems"], t["max_operand"], t["seed"])
tiny.save_problems(Path(a["out"]), rows)
print(f"{len(rows)} problems -> {a['out']}")
