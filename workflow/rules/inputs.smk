# What each job reads and depends on: its input files, its settings (a change reruns it), its code, its log.


def log_for(name):
    return out(paths.LOG).format(name=name)


def shared_log_for(name):
    """The log of a job whose output every study shares (the built tiny and random models): results/logs/."""
    return paths.LOG.format(name=name)


def adapter_output():
    """A train job's adapter folder, where the study keeps them (save_adapters)."""
    return [directory(out(paths.ADAPTER))] if config["save_adapters"] else []


def train_log(wildcards):
    return log_for(paths.TRAIN_LOG.format(**wildcards))


def forced_train_outputs():
    """The statistics files of the train jobs the user told Snakemake to rerun: --forceall, --forcerun with the
    rule or the file, -f/--force with the file as a target. Not the jobs Snakemake reruns as incomplete
    (--rerun-incomplete forces those too, and they are what the run cache is for)."""
    s = workflow.dag_settings
    named = {os.path.normpath(str(t)) for t in [*s.forcerun, *(s.targets if s.forcetargets else ())]}
    forced = []
    for job in workflow.dag.needrun_jobs():
        if job.rule.name == "train" and (s.forceall or "train" in named or
                                         any(os.path.normpath(str(f)) in named for f in job.output)):
            forced += [str(f) for f in job.output]
    return sorted(forced)


def model_path():
    """The from_pretrained argument of train jobs: the primed tiny model, the random one, or the config's id or path."""
    return {TINY: paths.PRIMED_MODEL, RANDOM: paths.RANDOM_MODEL}.get(config["model"], config["model"])


def random_architecture():
    """The config.json that model: random is built from, as a dict (None for other studies)."""
    if config["model"] != RANDOM:
        return None
    from grpo_equivalence.training.random_model import load_architecture

    return load_architecture(architecture_path(config["random_model"]["architecture"]))


def dataset_spec():
    """The config's dataset section with the tiny study's file in place of "tiny"."""
    spec = dict(config["dataset"])
    if spec["path"] == TINY:
        spec.update(path="json", data_files=paths.TINY_DATA, name=None)
    return spec


def get_rollout_inputs(wildcards):
    return {**model_inputs(), **measured_first(wildcards.backend, max(STEPS))}


def get_train_inputs(wildcards):
    if wildcards.replicate:
        return {**model_inputs(), **measured_first(wildcards.backend, wildcards.steps)}
    return {**model_inputs(), **speed_run_last(wildcards.backend, int(wildcards.steps))}


def local_input_stamps(wildcards):
    """The user's own input files as the file system last saw them change (size, modification and change time), as
    a param: a file replaced by other content with an older modification time (`cp -p`), which Snakemake's times
    miss, still reruns the jobs that read it; a train job whose inputs' content is unchanged then restores its run
    from the run cache, which keys on content."""
    stamps = [[name, (st := os.stat(name)).st_size, st.st_mtime_ns, st.st_ctime_ns] for name in LOCAL_INPUTS]
    return job_args(stamps=stamps)


def stats_stamps(files):
    """The statistics files a job reads, each by its content (sha256; "missing" where there is none), as a param: a
    file edited by hand, copied back over with its old times (`cp -a` keeps the modification time), or deleted reruns
    what reads it, and a deleted one is made again (restored from the run cache) first. Snakemake's own times miss
    the last two. Content, not times: a study folder copied or moved elsewhere stays up to date.
    Call it with the files named from the wildcards, never with a param function's `input`: Snakemake leaves a
    param derived from `input` out of its rerun decision. The job records the stamps it saw when it ran (Snakemake
    evaluates params again at run time), so a file rewritten upstream in the same run does not rerun it later."""
    stamps = []
    for name in map(str, files):
        try:
            stamps.append([name, stats_io.content_digest(name)])
        except FileNotFoundError:
            stamps.append([name, "missing"])
    return job_args(stamps=stamps)


def model_inputs():
    """What a job that loads the study's model and data reads."""
    inputs = {}
    if config["model"] in (TINY, RANDOM):
        inputs["model"] = model_path()
    if config["dataset"]["path"] == TINY:
        inputs["data"] = paths.TINY_DATA
    # The user's own model folder and data files: a changed file reruns the job (and keys the run cache)
    inputs["local"] = LOCAL_INPUTS
    return inputs


def train_code(wildcards):
    """The training code of this backend: the train script with what it imports, and the backend's own file
    (imported by name at run time, so named here)."""
    modules, files = backends.code_of(wildcards.backend)
    return script_code("train", *modules, files=[*files, *STUDY_CODE])


def rollout_code(wildcards):
    """The rollout check's code of this backend, as train_code."""
    modules, files = backends.code_of(wildcards.backend)
    return script_code("rollout_check", *modules, files=[*files, *STUDY_CODE])


def trainer_code(backend):
    """The trainer check's code of this backend, as train_code, and of the backend it is built as where its engine
    cannot load in a precision (backends.trainer_check_backend)."""
    modules, files = backends.code_of(backend)
    without = getattr(backends.get(backend), "without_engine", None)
    if without:
        more_modules, more_files = backends.code_of(without)
        modules, files = [*modules, *more_modules], [*files, *more_files]
    return script_code("trainer_check", *modules, files=[*files, *STUDY_CODE])


# The control of the trainer check: the reference in the other precision (what rounding alone changes)
OTHER_PRECISION = {"float32": "bfloat16", "bfloat16": "float32", "float16": "float32"}


def get_trainer_settings(backend, variant):
    """What a trainer check depends on: the training settings at the study's seed, in the other precision for the
    control."""
    settings = get_train_settings(SimpleNamespace(backend=backend, replicate=""))
    if variant:
        settings["dtype"] = OTHER_PRECISION[settings["dtype"]]
    return settings


def trainer_checks():
    """The trainer check's comparisons of every candidate with the reference (the report reads them), and the
    control's; none where the study turns the check off."""
    if not config["trainer_check"]:
        return []
    return expand(out(paths.TRAINER_COMPARISON), candidate=[*CANDIDATES, f"{REFERENCE}_control"], reference=REFERENCE)


def get_trainer_compare_inputs(wildcards):
    """A candidate's trainer check (or the control's), the reference's and the control's, with their tensors."""
    checks = {"reference": (REFERENCE, ""), "candidate": (wildcards.candidate, ""), "control": (REFERENCE, "_control")}
    if wildcards.candidate == f"{REFERENCE}_control":
        checks["candidate"] = (REFERENCE, "_control")
    inputs = {}
    for role, (backend, variant) in checks.items():
        inputs[role] = out(paths.TRAINER_CHECK).format(backend=backend, variant=variant)
        inputs[f"{role}_tensors"] = out(paths.TRAINER_TENSORS).format(backend=backend, variant=variant)
    return inputs


def seed_of(wildcards):
    """The seed of a train job: the study's, or the one its replicate's file name carries."""
    return int(wildcards.replicate.removeprefix("_seed")) if wildcards.replicate else SEED


def get_train_settings(wildcards):
    """Everything of the config that a train job's numbers depend on: a change reruns the job."""
    keys = ("model", "dataset", "system_prompt", "rewards", "chat_template", "dtype", "max_seq_length", "lora", "grpo",
            "gpus_per_train_job", "recorder")
    settings = {key: config.get(key) for key in keys}
    settings["grpo"] = {**config["grpo"], "seed": seed_of(wildcards)}
    # Only this backend's options: another backend's do not rerun this job.
    base = fault_split(wildcards.backend)[0]  # BACKEND+FAULT runs with its backend's options
    settings["backend_options"] = {base: config.get("backend_options", {}).get(base, {})}
    return settings


def get_rollout_settings(wildcards):
    """What a rollout check depends on: the training settings at its seed but the optimiser's and the loss's (it samples
    at fixed weights), and the check's own but those only its verdict reads."""
    check = {k: v for k, v in config["rollout_check"].items() if k not in ROLLOUT_VERDICT_ONLY}
    return {**sampling_settings(get_train_settings(wildcards)), "rollout_check": check}


def rollout_checks():
    """The rollout-check files of every backend at the study's seed, and the reference's at the next seed."""
    return [out(paths.ROLLOUT).format(backend=b, replicate="") for b in BACKENDS] + [
        out(paths.ROLLOUT).format(backend=REFERENCE, replicate=f"_seed{SEED + 1}")]


def runs_of(backend, steps):
    """The statistics files of one backend and step count: the study's seed, then its replicates."""
    count = config["replicates"]["reference" if backend == REFERENCE else "others"]
    return [out(paths.STATS).format(backend=backend, steps=steps)] + [
        out(paths.REPLICATE_STATS).format(backend=backend, steps=steps, seed=SEED + i) for i in range(1, count)
    ]


def get_compare_inputs(wildcards):
    return {"reference": runs_of(wildcards.reference, wildcards.steps),
            "candidate": runs_of(wildcards.candidate, wildcards.steps)}


def curve_runs(steps):
    """The statistics files one step count's curves are drawn from: every backend's runs."""
    return [path for backend in BACKENDS for path in runs_of(backend, steps)]


def all_stats():
    return [path for backend in BACKENDS for steps in STEPS for path in runs_of(backend, steps)]


def all_summaries():
    return expand(out(paths.SUMMARY), backend=BACKENDS, steps=STEPS)


def all_comparisons():
    return expand(out(paths.COMPARISON), candidate=CANDIDATES, reference=REFERENCE, steps=STEPS)
