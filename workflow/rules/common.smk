# Shared by every rule: the package on the path, the config checked, and the input functions.
import json
import os
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

# The project's own folder, from this file's place (not workflow.basedir, which is the including workflow's
# when this one is used as a Snakemake module, nor the working directory).
PROJECT = Path(workflow.current_basedir).resolve().parents[1]
# The package: the checkout's src/ beside this Snakefile (so that the rules and the code they run are of one
# version), else the package as installed. Jobs inherit the path through PYTHONPATH, whatever environment
# they run in (a venv, a rule's conda env, a cluster node).
SRC = PROJECT / "src"
if (SRC / "grpo_equivalence").is_dir():
    sys.path.insert(0, str(SRC))
    os.environ.update(PYTHONPATH=os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p))

from grpo_equivalence import backends, gpushare, paths, rewards, runcache, schedule
from grpo_equivalence.codedeps import code_hash
from grpo_equivalence.faults import split as fault_split
from grpo_equivalence.report import TEMPLATE as REPORT_TEMPLATE
from grpo_equivalence.config import (SCHEMA, TINY, RANDOM, CHAT_TEMPLATE_STUDY, ConfigError, architecture_path, check,
                                     chat_template_file, is_local, load_study, local_input_files, with_overrides)


def study_file():
    """The study's file: `--config study=FILE` (relative to where snakemake was started, or to the working
    directory), else a --configfile that Snakemake has read itself (None), else config.yaml."""
    path = config.get("study")
    if path is None:
        return None if workflow.configfiles else PROJECT / "config.yaml"
    for base in (Path.cwd(), Path(os.environ.get("PWD", "."))):
        if (base / path).expanduser().exists():
            return (base / path).expanduser()
    return Path(path)


# Our own reading and checks first: a YAML error with its line, each bad key with its fix in one line (the
# schema's raw error quotes the whole schema), every problem at once. Then the schema itself through
# Snakemake (which also fills defaults).
try:
    overrides = {k: v for k, v in workflow.config_settings.config.items() if k != "study"}
    path = study_file()
    study = with_overrides(dict(config) if path is None else load_study(path), overrides)
    study.pop("study", None)
    config.clear()
    config.update(study)
    # Where a study's relative reward file or chat template file lies: beside the study file, else here
    BASES = [Path(f).parent for f in ([path] if path is not None else workflow.configfiles)] + [Path.cwd()]
    check(config, BASES)
except ConfigError as error:
    named = [str(path)] if path is not None else list(map(str, workflow.configfiles))
    raise WorkflowError(f"{error}\n(study: {', '.join(named)})")
validate(config, str(SCHEMA))

# Jobs run `python workflow/scripts/STAGE.py ...`: `python` is the interpreter running Snakemake
# (its folder goes first on PATH), or the rule's own when its conda environment is activated over it.
os.environ.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))

# The study's reward functions and chat template as the jobs find them (files made absolute: io, not settings,
# so that a clone elsewhere reruns nothing), and the files of them outside the project, whose content is part of
# the training code (a changed reward file reruns the train jobs).
REWARD_SPECS = rewards.resolved(config["rewards"], BASES)
TEMPLATE_FILE = (chat_template_file(config["chat_template"], BASES)
                 if config["chat_template"] not in (None, CHAT_TEMPLATE_STUDY) and "{" not in config["chat_template"]
                 else None)
STUDY_CODE = rewards.code_files(REWARD_SPECS) + ([str(TEMPLATE_FILE)] if TEMPLATE_FILE else [])
RESOLVED = {"rewards": REWARD_SPECS, "chat_template": str(TEMPLATE_FILE) if TEMPLATE_FILE else config["chat_template"]}
# Groups the study's runs in the trackers (grpo.report_to)
STUDY_NAME = config.get("name") or (Path(path).stem if path is not None else "study")
BACKENDS = config["backends"]
REFERENCE = config["reference"]
STEPS = config["steps"]
CANDIDATES = [b for b in BACKENDS if b != REFERENCE]
SEED = config["grpo"]["seed"]


# Jobs run `python {SCRIPTS}/STAGE.py SETTINGS IO` (see grpo_equivalence.jobs for why not `script:`).
SCRIPTS = PROJECT / "workflow" / "scripts"
# Model and data on this machine: jobs are told to stay off the network, whatever the environment says.
OFFLINE = is_local(config)
LOCAL_INPUTS = local_input_files(config)


def job_args(**args):
    """A job's arguments as one JSON string. As the `settings` param, a change in them reruns the job;
    Snakemake ignores params computed from input or output paths (`io`) when deciding that."""
    return json.dumps(args, sort_keys=True, default=str)


def io_args(**args):
    """A job's paths and process settings (the `io` param): not compared by Snakemake."""
    return job_args(offline=OFFLINE, **args)


def entry_point(stage):
    """The `script` param of a rule: its entry point in workflow/scripts/. A function of the job's input, so
    that Snakemake does not compare it (the path differs between clones; the content is in `code`)."""
    return lambda wildcards, input: str(SCRIPTS / f"{stage}.py")


def script_code(stage, *modules, files=()):
    """A rule's rerun trigger: the content of its script, of the package modules the script imports (and
    theirs), of `modules` it reaches otherwise, and of other `files` it reads."""
    return code_hash(*modules, files=files, scripts=[SCRIPTS / f"{stage}.py"])


def conda_env(name):
    return f"../../envs/{name}.yaml"


def train_env():
    """The GPU stack when train jobs get GPUs, the CPU stack otherwise."""
    return conda_env("gpu" if config["gpus_per_train_job"] > 0 else "cpu")


def log_for(name):
    return paths.LOG.format(name=name)


def adapter_output():
    """A train job's adapter folder, where the study keeps them (save_adapters)."""
    return [directory(paths.ADAPTER)] if config["save_adapters"] else []


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
    from grpo_equivalence.random_model import load_architecture

    return load_architecture(architecture_path(config["random_model"]["architecture"]))


def dataset_spec():
    """The config's dataset section with the tiny study's file in place of "tiny"."""
    spec = dict(config["dataset"])
    if spec["path"] == TINY:
        spec.update(path="json", data_files=paths.TINY_DATA, name=None)
    return spec


# Several jobs on one GPU (gpu_sharing): run locally, they count no GPUs in Snakemake (the lease fits them onto
# the devices by memory and slots, within --resources gpu=N); on a cluster each job is an allocation of its own.
PACKS = gpushare.packs(config)


def gpu_resource():
    """The `gpu` resource of the jobs that train or sample on a GPU."""
    return 0 if PACKS and workflow.local_exec else config["gpus_per_train_job"]


def gpu_io(name, alone):
    """What a GPU job's lease needs (io, so that packing reruns nothing): the sharing settings, whether this
    run must have its GPU to itself, the GPUs Snakemake may use (--resources gpu=N), and the job's name in the
    other jobs' records of who shared their GPU."""
    limit = workflow.global_resources.get("gpu")
    limit = getattr(limit, "value", limit)
    return {"gpu_sharing": config["gpu_sharing"], "alone": alone, "max_gpus": limit if isinstance(limit, int) else None,
            "run": name}


def measured_first(backend, steps):
    """A packed job whose memory is to be measured waits for the study's seed run of its backend: that run takes
    a GPU of its own and measures what the others then ask for (ancient: the order only; a retrained run reruns
    none of them, and the run cache's key leaves it out)."""
    if PACKS and config["gpu_sharing"]["memory_gb"] is None:
        return {"measured": ancient(paths.STATS.format(backend=backend, steps=steps))}
    return {}


def speed_run_last(backend, steps):
    """With speed_runs: last, the study's seed run waits for the other seeds (which compiled what it needs), so
    that it runs alone with warm caches: the other seeds of every backend and step count, not only its own. A run
    alone empties its GPU first, and speed runs let in between packed ones would empty it once for each."""
    if PACKS and config["gpu_sharing"]["speed_runs"] == "last":
        return {"measured": [ancient(p) for b in BACKENDS for n in STEPS for p in runs_of(b, n)[1:]]}
    return {}


def keyed_inputs(input):
    """A job's input files but the runs it only waited for (measured_first, speed_run_last): what keys its caches."""
    waited = input.get("measured") or []
    waited = {str(waited)} if isinstance(waited, str) else set(map(str, waited))
    return [str(f) for f in input if str(f) not in waited]


def get_rollout_inputs(wildcards):
    return {**model_inputs(), **measured_first(wildcards.backend, max(STEPS))}


def get_train_inputs(wildcards):
    if wildcards.replicate:
        return {**model_inputs(), **measured_first(wildcards.backend, wildcards.steps)}
    return {**model_inputs(), **speed_run_last(wildcards.backend, int(wildcards.steps))}


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
    """What a rollout check depends on: the training settings at its seed, and the check's own."""
    return {**get_train_settings(wildcards), "rollout_check": config["rollout_check"]}


def rollout_checks():
    """The rollout-check files of every backend at the study's seed, and the reference's at the next seed."""
    return [paths.ROLLOUT.format(backend=b, replicate="") for b in BACKENDS] + [
        paths.ROLLOUT.format(backend=REFERENCE, replicate=f"_seed{SEED + 1}")]


def runs_of(backend, steps):
    """The statistics files of one backend and step count: the study's seed, then its replicates."""
    count = config["replicates"]["reference" if backend == REFERENCE else "others"]
    return [paths.STATS.format(backend=backend, steps=steps)] + [
        paths.REPLICATE_STATS.format(backend=backend, steps=steps, seed=SEED + i) for i in range(1, count)
    ]


def get_compare_inputs(wildcards):
    return {"reference": runs_of(wildcards.reference, wildcards.steps),
            "candidate": runs_of(wildcards.candidate, wildcards.steps)}


def all_stats():
    return [path for backend in BACKENDS for steps in STEPS for path in runs_of(backend, steps)]


def all_summaries():
    return expand(paths.SUMMARY, backend=BACKENDS, steps=STEPS)


def all_comparisons():
    return expand(paths.COMPARISON, candidate=CANDIDATES, reference=REFERENCE, steps=STEPS)
