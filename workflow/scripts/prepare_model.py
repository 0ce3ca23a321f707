from pathlib import Path

from grpo_equivalence import tiny
from grpo_equivalence.joblog import to_log

with to_log(snakemake.log[0]):
    t = snakemake.params.tiny
    tiny.save_model(Path(snakemake.output[0]), hidden_size=t["hidden_size"], num_layers=t["num_layers"], seed=t["seed"])
