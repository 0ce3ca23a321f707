from pathlib import Path

from grpo_equivalence import tiny
from grpo_equivalence.joblog import to_log

with to_log(snakemake.log[0]):
    t = snakemake.params.tiny
    rows = tiny.problems(t["problems"], t["max_operand"], t["seed"])
    tiny.save_problems(Path(snakemake.output[0]), rows)
    print(f"{len(rows)} problems -> {snakemake.output[0]}")
