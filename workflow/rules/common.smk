# Shared by every rule: the package on the path, the study read and checked, and what every job is given.
import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

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

from grpo_equivalence.analysis import stats as stats_io
from grpo_equivalence.report.render import template_files
from grpo_equivalence.runtime import paths
from grpo_equivalence.runtime.codedeps import code_hash
from grpo_equivalence.runtime.jobs import args_file
from grpo_equivalence.runtime.paths import SCHEMA
from grpo_equivalence.study import gpushare, runcache, schedule
from grpo_equivalence.study.config import (RANDOM, ROLLOUT_VERDICT_ONLY, TINY, ConfigError, load_study,
                                          results_folder, sampling_settings, study_name, with_overrides)
from grpo_equivalence.study.inputs import (CHAT_TEMPLATE_STUDY, architecture_path, chat_template_file, is_local,
                                           local_input_files)
from grpo_equivalence.study.validate import check
from grpo_equivalence.training import backends, reward_code, rewards
from grpo_equivalence.training.faults import split as fault_split
from grpo_equivalence.training.prime import THREADS as PRIME_THREADS


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
    # Groups the study's runs in the trackers (grpo.report_to), and names its results folder by default
    STUDY_NAME = study_name(config, path)
    # The folder of the study's own outputs (results/NAME by default): out() puts each of them there
    RESULTS = results_folder(config, path)
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
STUDY_CODE = reward_code.code_files(REWARD_SPECS) + ([str(TEMPLATE_FILE)] if TEMPLATE_FILE else [])
RESOLVED = {"rewards": REWARD_SPECS, "chat_template": str(TEMPLATE_FILE) if TEMPLATE_FILE else config["chat_template"]}
BACKENDS = config["backends"]
REFERENCE = config["reference"]
STEPS = config["steps"]
CANDIDATES = [b for b in BACKENDS if b != REFERENCE]
SEED = config["grpo"]["seed"]


# Jobs run `python {SCRIPTS}/STAGE.py SETTINGS IO` (see grpo_equivalence.runtime.jobs for why not `script:`).
SCRIPTS = PROJECT / "workflow" / "scripts"
# Model and data on this machine: jobs are told to stay off the network, whatever the environment says.
OFFLINE = is_local(config)
LOCAL_INPUTS = local_input_files(config)


def out(template):
    """One of the study's own outputs (a template of grpo_equivalence.runtime.paths) in its results folder."""
    return paths.of_study(template, RESULTS)


def job_args(**args):
    """A job's arguments, as @FILE of their JSON (named after its content). As the `settings` param, a change in
    them reruns the job; Snakemake ignores params computed from input or output paths (`io`) when deciding that."""
    return args_file(json.dumps(args, sort_keys=True, default=str), paths.JOB_ARGS)


# Every job's command: its script with its two arguments, its output to its log; when it fails, its last line and
# the log's path on the console (grpo_equivalence.runtime.jobs.last_error), and its status kept
JOB_COMMAND = ("python {params.script:q} {params.settings:q} {params.io:q} > {log:q} 2>&1 "
               "|| python -m grpo_equivalence.runtime.jobs {log:q} $?")


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
