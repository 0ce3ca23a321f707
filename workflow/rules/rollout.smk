# The rollout check at fixed weights: each backend samples the same prompts from the study's model with a fresh
# adapter through its own rollout path, and the trainer scores every sampled token (grpo_equivalence.checks.rollout).
# No training: minutes, where the training verdict needs runs. The reference is checked with a second seed too,
# the control that shows how a correct sampler compares with itself.


rule rollout_check:
    input:
        unpack(get_rollout_inputs),
    output:
        out(paths.ROLLOUT),
    params:
        settings=lambda wildcards: job_args(
            config=get_rollout_settings(wildcards),
            backend=wildcards.backend,
            model_path=model_path(),
            dataset=dataset_spec(),
        ),
        local_inputs=local_input_stamps,
        script=entry_point("rollout_check"),
        code=lambda wildcards: rollout_code(wildcards),
        # code and inputs key the compile caches the check shares with the backend's other jobs (runcache)
        io=lambda wildcards, input, output, threads: io_args(
            out=output[0],
            threads=threads,
            code=rollout_code(wildcards),
            inputs=keyed_inputs(input),
            run_cache=config["run_cache"],
            resolved=RESOLVED,
            **gpu_io(f"rollout check {wildcards.backend} seed {seed_of(wildcards)}", alone=False),
        ),
    # Before the train jobs of its backend: a check is short, and its vLLM engine start is best paid early
    priority: lambda wildcards: schedule.priority(wildcards.backend, max(STEPS)) + 1
    resources:
        gpu=gpu_resource(),
        **config["job_resources"],
    threads: config.get("train_threads", 1)
    conda:
        train_env()
    log:
        log_for("rollout/{backend}{replicate}"),
    shell:
        JOB_COMMAND
