# The built-in tiny study: a tiny Qwen3 and an arithmetic data set, built here; priming teaches the format.


rule prepare_model:
    output:
        directory(paths.TINY_MODEL),
    params:
        settings=job_args(tiny=config.get("tiny")),
        script=entry_point("prepare_model"),
        code=script_code("prepare_model"),
        io=lambda wildcards, output: io_args(out=output[0]),
    conda:
        conda_env("cpu")
    log:
        shared_log_for("prepare_model"),
    shell:
        JOB_COMMAND


rule prepare_data:
    output:
        paths.TINY_DATA,
    params:
        settings=job_args(tiny=config.get("tiny")),
        script=entry_point("prepare_data"),
        code=script_code("prepare_data"),
        io=lambda wildcards, output: io_args(out=output[0]),
    conda:
        conda_env("cpu")
    log:
        shared_log_for("prepare_data"),
    shell:
        JOB_COMMAND


rule prime:
    input:
        model=paths.TINY_MODEL,
        data=paths.TINY_DATA,
    output:
        directory(paths.PRIMED_MODEL),
    params:
        # The system prompt is part of every prompt priming trains on (training.prime.encode): a changed one primes
        # the model again, as the model then answers other prompts
        settings=job_args(
            tiny=config.get("tiny"), system_prompt=config.get("system_prompt"), dtype=config["dtype"]
        ),
        script=entry_point("prime"),
        code=script_code("prime"),
        io=lambda wildcards, input, output: io_args(model=input.model, data=input.data, out=output[0]),
    threads: PRIME_THREADS  # the job computes with that many, whatever --cores leaves it
    conda:
        conda_env("cpu")
    log:
        shared_log_for("prime"),
    # The study's longest job on a CPU, silent on the console otherwise: what it does and where its progress shows
    message:
        "Priming the tiny model on the answer format: {config[tiny][prime_steps]} SFT steps, a few minutes on two cores "
        "(every 20 steps a line in {log})"
    shell:
        JOB_COMMAND
