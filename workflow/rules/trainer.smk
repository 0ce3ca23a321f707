# The trainer check at fixed weights on one batch: the reference samples one generation batch, then each backend's
# own trainer computes from it, without sampling, the log-probabilities, KL, advantages, loss, gradient, clipping and
# one optimizer step (grpo_equivalence.checks.trainer); each is compared with the reference's, against what the
# reference's own precision change does (the control: the reference in the other precision), and the report names
# where two trainer stacks part.


rule trainer_batch:
    input:
        unpack(lambda wildcards: model_inputs()),
    output:
        out(paths.TRAINER_BATCH),
    params:
        settings=lambda wildcards: job_args(
            config=sampling_settings(get_trainer_settings(REFERENCE, "")),  # it samples: the optimiser's settings aside
            backend=REFERENCE,
            model_path=model_path(),
            dataset=dataset_spec(),
        ),
        local_inputs=local_input_stamps,
        script=entry_point("trainer_batch"),
        code=lambda wildcards: trainer_code(REFERENCE),
        io=lambda wildcards, input, output, threads: io_args(
            out=output[0],
            threads=threads,
            code=trainer_code(REFERENCE),
            inputs=keyed_inputs(input),
            run_cache=config["run_cache"],
            resolved=RESOLVED,
            **gpu_io(f"trainer batch {REFERENCE}", alone=False),
        ),
    resources:
        gpu=gpu_resource(),
        **config["job_resources"],
    threads: config.get("train_threads", 1)
    conda:
        train_env()
    log:
        log_for("trainer/batch"),
    shell:
        JOB_COMMAND


rule trainer_check:
    input:
        unpack(lambda wildcards: model_inputs()),
        batch=out(paths.TRAINER_BATCH),
    output:
        out(paths.TRAINER_CHECK),
        out(paths.TRAINER_TENSORS),
    params:
        settings=lambda wildcards: job_args(
            config=get_trainer_settings(wildcards.backend, wildcards.variant),
            backend=wildcards.backend,
            max_steps=max(STEPS),
            model_path=model_path(),
            dataset=dataset_spec(),
        ),
        local_inputs=local_input_stamps,
        script=entry_point("trainer_check"),
        code=lambda wildcards: trainer_code(wildcards.backend),
        io=lambda wildcards, input, output, threads: io_args(
            batch=input.batch,
            out=output[0],
            tensors=output[1],
            threads=threads,
            code=trainer_code(wildcards.backend),
            inputs=keyed_inputs(input),
            run_cache=config["run_cache"],
            resolved=RESOLVED,
            **gpu_io(f"trainer check {wildcards.backend}{wildcards.variant}", alone=False),
        ),
    resources:
        gpu=gpu_resource(),
        **config["job_resources"],
    threads: config.get("train_threads", 1)
    conda:
        train_env()
    log:
        log_for("trainer/{backend}{variant}"),
    shell:
        JOB_COMMAND


rule trainer_compare:
    input:
        unpack(get_trainer_compare_inputs),
    output:
        out(paths.TRAINER_COMPARISON),
    params:
        settings=job_args(),
        script=entry_point("trainer_compare"),
        code=script_code("trainer_compare"),
        io=lambda wildcards, input, output: io_args(
            reference=[input.reference, input.reference_tensors],
            candidate=[input.candidate, input.candidate_tensors],
            control=[input.control, input.control_tensors],
            out=output[0],
        ),
    conda:
        conda_env("cpu")
    log:
        log_for("trainer/{candidate}_vs_{reference}"),
    shell:
        JOB_COMMAND
