# GRPO training, one job per backend x step count x seed (the study's, then each replicate's). The `gpu`
# resource lets Snakemake run as many train jobs at once as --resources gpu=N allows (0 in the CPU tiny
# study, so they only share cores); each job then leases its own GPU(s) (grpo_equivalence.runtime.gpus), since
# Snakemake only counts them.


rule train:
    input:
        unpack(get_train_inputs),
    output:
        out(paths.RUN_STATS),
        *adapter_output(),
    params:
        settings=lambda wildcards: job_args(
            config=get_train_settings(wildcards),
            backend=wildcards.backend,
            steps=int(wildcards.steps),
            model_path=model_path(),
            dataset=dataset_spec(),
        ),
        local_inputs=local_input_stamps,
        script=entry_point("train"),
        code=train_code,
        # The run cache's key: these settings, this code, the content of the inputs, and what the job reads of
        # its machine (runcache); run_cache: false turns it off without rerunning anything
        io=lambda wildcards, input, output, threads: io_args(
            out=output[0],
            threads=threads,
            code=train_code(wildcards),
            inputs=keyed_inputs(input),
            log=train_log(wildcards),
            run_cache=config["run_cache"],
            study=STUDY_NAME,
            resolved=RESOLVED,
            adapter=output[1] if len(output) > 1 else None,
            **gpu_io(f"{wildcards.backend}_{wildcards.steps}_seed{seed_of(wildcards)}",
                     alone=config["gpu_sharing"]["speed_runs"] != "packed" and not wildcards.replicate),
        ),
    # Longest expected job first, so that the GPUs finish together (grpo_equivalence.study.schedule).
    priority: lambda wildcards: schedule.priority(wildcards.backend, int(wildcards.steps))
    resources:
        gpu=gpu_resource(),
        **config["job_resources"],
    threads: config.get("train_threads", 1)
    conda:
        train_env()
    log:
        log_for(paths.TRAIN_LOG),
    benchmark:
        out(paths.BENCHMARK).format(name=paths.TRAIN_LOG)
    shell:
        JOB_COMMAND


# A job Snakemake was told to rerun (--forcerun, --forceall, -f on its file) trains, whatever the run cache holds:
# the cache is for interrupted and repeated work, not for overriding an explicit request. Its jobs learn which
# runs through the environment (inherited by local jobs and by SLURM's).
# Run locally, a backend that cannot train on this machine stops the workflow before any job starts
# (each train job checks again at its start, which is what counts on a cluster: there the planning
# machine, e.g. a login node, need not have the GPU stack).
# A CPU study run locally starts its jobs from the job server (grpo_equivalence.runtime.jobserver), one interpreter
# that imported torch, transformers, PEFT and TRL once: a tiny job spends seconds importing them and one training.
# Started last, with the environment its jobs get, where enough jobs import TRL to pay for it; it stops with the
# workflow, however the workflow ends.
onstart:
    os.environ[runcache.FORCED_ENV] = json.dumps(forced_train_outputs())
    from grpo_equivalence.runtime import jobs as job_runtime

    os.environ[job_runtime.WORKFLOW_ENV] = job_runtime.workflow_mark()  # a job started as Snakemake dies stops
    if workflow.local_exec:
        pending = sorted({j.wildcards.backend for j in workflow.dag.needrun_jobs() if j.rule.name == "train"})
        if pending:
            from grpo_equivalence.training.session import check_runnable

            check_runnable(config, pending)
        from grpo_equivalence.runtime import jobserver

        needed = [job.rule.name for job in workflow.dag.needrun_jobs()]
        if config["job_server"] and config["gpus_per_train_job"] == 0 and jobserver.worth_starting(needed):
            jobserver.start(os.getpid(), out(paths.JOB_SERVER_LOG), offline=OFFLINE)


onsuccess:
    from grpo_equivalence.runtime import jobserver

    jobserver.stop()
    notes = Path(out(paths.REPORT)).with_name(".report-notes.txt")  # render.NOTES: what the report says loudly
    if notes.exists():
        print(notes.read_text(), end="", file=sys.stderr)


onerror:
    from grpo_equivalence.runtime import jobserver

    jobserver.stop()
