from pathlib import Path

from grpo_equivalence import train
from grpo_equivalence.joblog import to_log

with to_log(snakemake.log[0]):
    import torch

    torch.set_num_threads(snakemake.threads)
    train.run(snakemake.config, snakemake.wildcards.backend, int(snakemake.wildcards.steps),
              model_path=snakemake.params.model_path, dataset=snakemake.params.dataset, out=Path(snakemake.output[0]))
