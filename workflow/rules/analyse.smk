# Derived from the statistics files only: a summary per run with the study's seed, and per candidate and
# step count a comparison with the reference: its runs of every seed against the reference's.


rule summarise:
    input:
        out(paths.STATS),
    output:
        out(paths.SUMMARY),
    params:
        settings=job_args(skip=config["median_skip_steps"]),
        stamps=lambda wildcards: stats_stamps([out(paths.STATS).format(backend=wildcards.backend, steps=wildcards.steps)]),
        script=entry_point("summarise"),
        code=script_code("summarise"),
        io=lambda wildcards, input, output: io_args(stats=input[0], out=output[0]),
    conda:
        conda_env("cpu")
    log:
        log_for("summarise/{backend}_{steps}"),
    shell:
        JOB_COMMAND


rule compare:
    input:
        unpack(get_compare_inputs),
    output:
        out(paths.COMPARISON),
    params:
        settings=job_args(**config["verdict"]),
        stamps=lambda wildcards: stats_stamps(sum(get_compare_inputs(wildcards).values(), [])),
        script=entry_point("compare"),
        code=script_code("compare"),
        io=lambda wildcards, input, output: io_args(
            reference=list(input.reference), candidate=list(input.candidate), out=output[0]
        ),
    conda:
        conda_env("cpu")
    log:
        log_for("compare/{candidate}_vs_{reference}_{steps}"),
    shell:
        JOB_COMMAND
