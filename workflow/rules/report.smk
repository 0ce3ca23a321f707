# The report, rendered from the summaries and comparisons with report_templates/grpo_equivalence.md.j2.


rule render_report:
    input:
        summaries=all_summaries(),
        comparisons=all_comparisons(),
        stats=all_stats(),
        template=str(REPORT_TEMPLATE),
    output:
        report(paths.REPORT, category="Equivalence"),
    params:
        reference=REFERENCE,
    conda:
        conda_env("cpu")
    log:
        log_for("render_report"),
    script:
        "../scripts/render_report.py"
