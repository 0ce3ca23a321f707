# The built-in tiny study: a tiny Qwen3 and an arithmetic data set, built here; priming teaches the format.


rule prepare_model:
    output:
        directory(paths.TINY_MODEL),
    params:
        tiny=config.get("tiny"),
    conda:
        conda_env("cpu")
    log:
        log_for("prepare_model"),
    script:
        "../scripts/prepare_model.py"


rule prepare_data:
    output:
        paths.TINY_DATA,
    params:
        tiny=config.get("tiny"),
    conda:
        conda_env("cpu")
    log:
        log_for("prepare_data"),
    script:
        "../scripts/prepare_data.py"


rule prime:
    input:
        model=paths.TINY_MODEL,
        data=paths.TINY_DATA,
    output:
        directory(paths.PRIMED_MODEL),
    params:
        tiny=config.get("tiny"),
        system_prompt=config.get("system_prompt"),
    threads: 2
    conda:
        conda_env("cpu")
    log:
        log_for("prime"),
    script:
        "../scripts/prime.py"
