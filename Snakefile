# GRPO rollout-backend equivalence: train every backend x step count, summarise, compare, report.
# The study is config.yaml; the built-in tiny study (CPU, no network) is studies/tiny.yaml.
from snakemake.utils import min_version

min_version("9.0")


# A study is one whole file: --configfile names another (e.g. studies/tiny.yaml) instead of this one,
# rather than being merged key by key into it (a merge would leak the GPU study's settings into others).
if not workflow.configfiles:

    configfile: "config.yaml"


include: "workflow/rules/common.smk"


wildcard_constraints:
    backend="|".join(BACKENDS),
    candidate="|".join(CANDIDATES) or "none",
    reference=REFERENCE,
    steps=r"\d+",


include: "workflow/rules/tiny.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/analyse.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        paths.REPORT,
