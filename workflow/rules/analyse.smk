# Derived from the statistics files only: a summary per run, a comparison per candidate and step count.


rule summarise:
    input:
        paths.STATS,
    output:
        paths.SUMMARY,
    params:
        settings=job_args(skip=config["median_skip_steps"]),
        code=code_hash("grpo_equivalence.summary"),
        io=lambda wildcards, input, output: job_args(stats=input[0], out=output[0]),
    conda:
        conda_env("cpu")
    log:
        log_for("summarise/{backend}_{steps}"),
    shell:
        "python -m grpo_equivalence.jobs summarise {params.settings:q} {params.io:q} > {log} 2>&1"


rule compare:
    input:
        reference=paths.STATS.format(backend="{reference}", steps="{steps}"),
        candidate=paths.STATS.format(backend="{candidate}", steps="{steps}"),
    output:
        paths.COMPARISON,
    params:
        settings=job_args(),
        code=code_hash("grpo_equivalence.compare"),
        io=lambda wildcards, input, output: job_args(
            reference=input.reference, candidate=input.candidate, out=output[0]
        ),
    conda:
        conda_env("cpu")
    log:
        log_for("compare/{candidate}_vs_{reference}_{steps}"),
    shell:
        "python -m grpo_equivalence.jobs compare {params.settings:q} {params.io:q} > {log} 2>&1"
