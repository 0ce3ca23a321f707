import json
from pathlib import Path

from grpo_equivalence import report, stats
from grpo_equivalence.joblog import to_log


def read(paths):
    return [json.loads(Path(p).read_text()) for p in paths]


with to_log(snakemake.log[0]):
    reference = snakemake.params.reference
    text = report.render(summaries=read(snakemake.input.summaries), comparisons=read(snakemake.input.comparisons),
                         reference=reference, runs=[stats.load(p) for p in snakemake.input.stats],
                         stats_files=list(snakemake.input.stats), template=Path(snakemake.input.template))
    Path(snakemake.output[0]).write_text(text)
