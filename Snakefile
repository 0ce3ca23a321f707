# GRPO rollout-backend equivalence: train every backend x step count, summarise, compare, report.
# The study is config.yaml; the built-in tiny study (CPU, no network) is studies/tiny.yaml.
from snakemake.utils import min_version

min_version("9.0")


# The study is one whole file: config.yaml, or the one `--config study=FILE` names (e.g. studies/tiny.yaml),
# read and checked by common.smk, with any other `--config key=value` pairs over it. It is never merged key
# by key into config.yaml, which would leak the GPU study's settings into others. (`--configfile FILE`
# works too, but Snakemake then reports a YAML syntax error without its line.)
include: "workflow/rules/common.smk"  # the study, checked; what every job is given
include: "workflow/rules/inputs.smk"  # what each job reads and depends on
include: "workflow/rules/packing.smk"  # GPU jobs: their lease, and which runs a packed job waits for


wildcard_constraints:
    backend="|".join(map(re.escape, BACKENDS)),
    # the trainer check compares its control, the reference in the other precision, as a candidate too
    candidate="|".join(map(re.escape, [*CANDIDATES, f"{REFERENCE}_control"])),
    reference=re.escape(REFERENCE),
    steps=r"\d+",
    replicate=r"(_seed\d+)?",
    variant=r"(_control)?",


# On a cluster (profiles/slurm) the jobs that only read statistics files and write tables, figures and the report
# run where Snakemake runs: as jobs of their own they would wait in the queue far longer than they run.
localrules:
    all,
    prepare_data,
    summarise,
    compare,
    plot_curves,
    plot_speed,
    render_report,
    trainer_compare,


include: "workflow/rules/tiny.smk"
include: "workflow/rules/random.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/rollout.smk"
include: "workflow/rules/trainer.smk"
include: "workflow/rules/analyse.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        out(paths.REPORT),
