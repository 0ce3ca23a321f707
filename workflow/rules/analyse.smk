# Derived from the statistics files only: a summary per run, a comparison per candidate and step count.


rule summarise:
    input:
        paths.STATS,
    output:
        paths.SUMMARY,
    params:
        skip=config["median_skip_steps"],
    conda:
        conda_env("cpu")
    log:
        log_for("summarise/{backend}_{steps}"),
    script:
        "../scripts/summarise.py"


rule compare:
    input:
        reference=paths.STATS.format(backend="{reference}", steps="{steps}"),
        candidate=paths.STATS.format(backend="{candidate}", steps="{steps}"),
    output:
        paths.COMPARISON,
    conda:
        conda_env("cpu")
    log:
        log_for("compare/{candidate}_vs_{reference}_{steps}"),
    script:
        "../scripts/compare.py"
