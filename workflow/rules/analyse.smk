# Derived from the statistics files only: a summary per run, a comparison per candidate and step count.


rule summarise:
    input:
        paths.STATS,
    output:
        paths.SUMMARY,
    params:
        settings=job_args(skip=config["median_skip_steps"]),
        script=entry_point("summarise"),
        code=script_code("summarise"),
        io=lambda wildcards, input, output: io_args(stats=input[0], out=output[0]),
    conda:
        conda_env("cpu")
    log:
        log_for("summarise/{backend}_{steps}"),
    shell:
        "python {params.script:q} {params.settings:q} {params.io:q} > {log} 2>&1"


rule compare:
    input:
        reference=paths.STATS.format(backend="{reference}", steps="{steps}"),
        candidate=paths.STATS.format(backend="{candidate}", steps="{steps}"),
    output:
        paths.COMPARISON,
    params:
        settings=job_args(),
        script=entry_point("compare"),
        code=script_code("compare"),
        io=lambda wildcards, input, output: io_args(
            reference=input.reference, candidate=input.candidate, out=output[0]
        ),
    conda:
        conda_env("cpu")
    log:
        log_for("compare/{candidate}_vs_{reference}_{steps}"),
    shell:
        "python {params.script:q} {params.settings:q} {params.io:q} > {log} 2>&1"
