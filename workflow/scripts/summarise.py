import json

from grpo_equivalence import stats
from grpo_equivalence.joblog import to_log
from grpo_equivalence.summary import summarise

with to_log(snakemake.log[0]):
    summary = summarise(stats.load(snakemake.input[0]), snakemake.params.skip)
    with open(snakemake.output[0], "w") as f:
        json.dump(summary, f, indent=1)
