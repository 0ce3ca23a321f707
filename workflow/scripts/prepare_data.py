"""Rule prepare_data: the seeded arithmetic problems of the tiny study, one JSON object per line."""

from pathlib import Path

from grpo_equivalence import jobs, tiny

a = jobs.arguments()
t = a["tiny"]
rows = tiny.problems(t["problems"], t["max_operand"], t["seed"])
tiny.save_problems(Path(a["out"]), rows)
print(f"{len(rows)} problems -> {a['out']}")
