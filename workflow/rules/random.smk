# A model of a real architecture with random weights (model: random), for speed and memory at real scale
# without a download: its shape from a published config.json, its weights from the study's seed.


rule prepare_random_model:
    output:
        directory(paths.RANDOM_MODEL),
    params:
        # The architecture's content, not its path: an edited config.json rebuilds the model
        settings=job_args(
            architecture=random_architecture(), random_model=config.get("random_model"), dtype=config["dtype"]
        ),
        script=entry_point("prepare_random_model"),
        code=script_code("prepare_random_model"),
        io=lambda wildcards, output: io_args(out=output[0]),
    threads: 4
    conda:
        conda_env("cpu")
    log:
        shared_log_for("prepare_random_model"),
    shell:
        JOB_COMMAND
