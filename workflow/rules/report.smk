# The figures and the report, rendered with report_templates/grpo_equivalence.md.j2. The template is not an
# input but hashed into `code`: an input is compared by modification time, and a fresh clone's timestamps
# would rerender an unchanged report. Outputs marked report() make up `snakemake --report report.html`.


rule plot_curves:
    input:
        lambda wildcards: curve_runs(wildcards.steps),
    output:
        report(out(paths.CURVES_FIGURE), caption="../report/curves.rst", category="Figures", labels={"steps": "{steps}"}),
    params:
        settings=job_args(reference=REFERENCE),
        stamps=lambda wildcards: stats_stamps(curve_runs(wildcards.steps)),
        script=entry_point("plot_curves"),
        code=script_code("plot_curves"),
        io=lambda wildcards, input, output: io_args(stats=list(input), out=output[0]),
    conda:
        conda_env("cpu")
    log:
        log_for("plot_curves_{steps}"),
    shell:
        JOB_COMMAND


rule plot_speed:
    input:
        all_summaries(),
    output:
        report(out(paths.SPEED_FIGURE), caption="../report/speed.rst", category="Figures", labels={"figure": "speed and memory"}),
    params:
        settings=job_args(reference=REFERENCE),
        script=entry_point("plot_speed"),
        code=script_code("plot_speed"),
        io=lambda wildcards, input, output: io_args(summaries=list(input), out=output[0]),
    conda:
        conda_env("cpu")
    log:
        log_for("plot_speed"),
    shell:
        JOB_COMMAND


rule render_report:
    input:
        summaries=all_summaries(),
        comparisons=all_comparisons(),
        stats=all_stats(),
        curves=expand(out(paths.CURVES_FIGURE), steps=STEPS),
        speed=out(paths.SPEED_FIGURE),
        rollout=rollout_checks(),
        trainer=trainer_checks(),
    output:
        report(out(paths.REPORT), caption="../report/equivalence.rst", category="Equivalence"),
    params:
        settings=job_args(reference=REFERENCE, verdict=config["verdict"], rollout_check=config["rollout_check"]),
        stamps=lambda wildcards: stats_stamps(all_stats()),
        script=entry_point("render_report"),
        code=script_code("render_report", files=template_files()),
        io=lambda wildcards, input, output: io_args(
            summaries=list(input.summaries),
            comparisons=list(input.comparisons),
            stats=list(input.stats),
            curves=dict(zip(STEPS, input.curves)),
            speed=input.speed,
            rollout=list(input.rollout),
            trainer=list(input.trainer),
            out=output[0],
        ),
    conda:
        conda_env("cpu")
    log:
        log_for("render_report"),
    shell:
        JOB_COMMAND
