import json

from grpo_equivalence import stats
from grpo_equivalence.compare import compare
from grpo_equivalence.joblog import to_log

with to_log(snakemake.log[0]):
    result = compare(stats.load(snakemake.input.reference), stats.load(snakemake.input.candidate))
    with open(snakemake.output[0], "w") as f:
        json.dump(result, f, indent=1)
