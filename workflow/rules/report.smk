# The report, rendered from the summaries and comparisons with report_templates/grpo_equivalence.md.j2.
# The template is not an input but hashed into `code`: an input is compared by
# modification time, and a fresh clone's timestamps would rerender an unchanged report.


rule render_report:
    input:
        summaries=all_summaries(),
        comparisons=all_comparisons(),
        stats=all_stats(),
    output:
        report(paths.REPORT, category="Equivalence"),
    params:
        settings=job_args(reference=REFERENCE),
        script=entry_point("render_report"),
        code=script_code("render_report", files=[REPORT_TEMPLATE]),
        io=lambda wildcards, input, output: io_args(
            summaries=list(input.summaries),
            comparisons=list(input.comparisons),
            stats=list(input.stats),
            out=output[0],
        ),
    conda:
        conda_env("cpu")
    log:
        log_for("render_report"),
    shell:
        "python {params.script:q} {params.settings:q} {params.io:q} > {log} 2>&1"
