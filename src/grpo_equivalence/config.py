"""Checks of the study's config that run before any job: the JSON schema, then what a schema cannot say.

Each problem is reported with the key it concerns and how to fix it; all problems are reported at once,
so that a user fixes the config in one go rather than one error per run.
"""

from pathlib import Path

import yaml

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
TINY = "tiny"  # the value of `model` / `dataset.path` that selects the built-in tiny study
RANDOM = "random"  # the value of `model` that builds a real architecture with random weights (random_model)
PROJECT = SCHEMA.parents[2]
TINY_MODEL_KEYS = ("hidden_size", "num_layers", "prime_steps", "prime_batch_size", "prime_learning_rate")


class ConfigError(ValueError):
    pass


def with_defaults(name: str, section: dict | None) -> dict:
    """A section of the study with the schema's defaults under it (the workflow's config has them filled in by
    the schema; a benchmark, a test or a job that gets its own copy gets them here)."""
    defaults = yaml.safe_load(SCHEMA.read_text())["properties"][name]["default"]
    return {**defaults, **(section or {})}


def rollout_check_settings(section: dict | None) -> dict:
    return with_defaults("rollout_check", section)


def load_study(path) -> dict:
    """A study file, as Snakemake would read it, but with the file, line and column of a YAML error."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"study file {path} not found; pass an existing file (e.g. studies/tiny.yaml)") from None
    except (IsADirectoryError, UnicodeDecodeError) as e:
        raise ConfigError(f"study file {path} is not a YAML text file ({type(e).__name__})") from None
    try:
        study = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({problem}); fix that line (indent with spaces, close every "
                          f"bracket and quote)") from None
    if not isinstance(study, dict):
        raise ConfigError(f"{path}: a study is a YAML mapping of settings (key: value), not a {type(study).__name__}")
    return study


def with_overrides(study: dict, overrides: dict) -> dict:
    """`--config key=value` pairs over a study file. Snakemake passes their values as text; they are read as
    YAML here, so that steps=[4,6] is a list of numbers rather than the string "[4,6]". A mapping merges into
    its section: grpo={learning_rate: 1.0e-5} changes that key alone."""
    def typed(value):
        if isinstance(value, str):
            return yaml.safe_load(value)
        if isinstance(value, list):
            return [typed(v) for v in value]
        if isinstance(value, dict):
            return {k: typed(v) for k, v in value.items()}
        return value

    def merged(base, value):
        # A section given on the command line changes the keys it names and keeps the others
        if isinstance(base, dict) and isinstance(value, dict):
            return {**base, **{k: merged(base.get(k), v) for k, v in value.items()}}
        return value

    return {**study, **{key: merged(study.get(key), typed(value)) for key, value in overrides.items()}}


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def schema_problems(config: dict, schema_path: Path = SCHEMA) -> list[str]:
    """The schema's complaints, one short line each (jsonschema's own text quotes the whole schema)."""
    import jsonschema

    schema = yaml.safe_load(schema_path.read_text())
    problems = []
    for error in sorted(jsonschema.Draft202012Validator(schema).iter_errors(config), key=lambda e: list(e.path)):
        where = _key(error.absolute_path)
        if error.validator == "additionalProperties":
            known = sorted(error.schema.get("properties", {}))
            unknown = sorted(set(error.instance) - set(known))
            for name in unknown:
                key = f"{where}.{name}" if error.absolute_path else name
                problems.append(f"{key}: unknown setting; remove it or fix its spelling (known here: {', '.join(known)})")
        elif error.validator == "required":
            problems.append(f"{where}: {error.message}; add it (see config.yaml for the study's value)")
        elif error.validator == "type" and "number" in str(error.validator_value) and _numeric_text(error.instance):
            problems.append(f"{where}: {error.instance!r} is text to YAML, not a number; write it with a dot and a "
                            f"signed exponent, e.g. {_float_spelling(error.instance)}")
        else:
            problems.append(f"{where}: {error.message}")
    return problems


def _numeric_text(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


def _float_spelling(text: str) -> str:
    """5e-4 -> 5.0e-4: the spelling YAML 1.1 (PyYAML, Snakemake) reads as a number."""
    mantissa, _, exponent = text.lower().partition("e")
    mantissa = mantissa if "." in mantissa else f"{mantissa}.0"
    if not exponent:
        return mantissa
    return f"{mantissa}e{exponent if exponent[0] in '+-' else '+' + exponent}"


def _get(config: dict, *keys, kind=object):
    """config[k1][k2]... if present and of `kind`, else None: cross-field checks skip what the schema rejects."""
    value = config
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def study_problems(config: dict, backend_names: list[str], backend_options: dict[str, dict],
                   data_parallel: tuple[str, ...] = ()) -> list[str]:
    """Cross-field checks, given the known backends, the options each one accepts and those that train a run on
    several processes (data_parallel). Each check runs on what is well-formed, so that a schema error elsewhere
    does not hide these."""
    problems = []
    backends = [b for b in (_get(config, "backends", kind=list) or []) if isinstance(b, str)]
    from .faults import FAULTS, split

    for name in backends:
        base, fault = split(name)
        if base not in backend_names:
            problems.append(f"backends: unknown backend {base!r}; choose among {', '.join(backend_names)}")
        if fault is not None and fault not in FAULTS:
            problems.append(f"backends: {name!r} names an unknown fault {fault!r}; choose among {', '.join(FAULTS)} "
                            f"(BACKEND+FAULT), or drop it")
    reference = _get(config, "reference", kind=str)
    if reference is not None and backends and reference not in backends:
        problems.append(
            f"reference: {reference!r} is not among backends {backends}; "
            f"add it to backends or pick one of them as reference"
        )
    warmup = _get(config, "median_skip_steps", kind=int)
    if warmup is not None:
        for steps in _get(config, "steps", kind=list) or []:
            if isinstance(steps, int) and steps <= warmup:
                problems.append(
                    f"steps: {steps} leaves no step for the median step time after median_skip_steps={warmup}; "
                    f"use at least {warmup + 1} steps or lower median_skip_steps"
                )
    batch_size, accumulation, generations = (_get(config, "grpo", key, kind=int) for key in (
        "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations"))
    if None not in (batch_size, accumulation, generations) and generations > 0 and (batch_size * accumulation) % generations:
        problems.append(
            f"grpo.num_generations: {generations} does not divide the generation batch "
            f"per_device_train_batch_size x gradient_accumulation_steps = {batch_size * accumulation}; make the "
            f"batch a multiple of num_generations (a group must fit in one batch)"
        )
    for name, options in (_get(config, "backend_options", kind=dict) or {}).items():
        if name not in backend_names:
            problems.append(f"backend_options.{name}: unknown backend; choose among {', '.join(backend_names)}")
            continue
        for key in options if isinstance(options, dict) else ():
            if key not in backend_options[name]:
                known = ", ".join(backend_options[name]) or "none"
                problems.append(f"backend_options.{name}.{key}: unknown option of {name} (known: {known})")
    gpus = _get(config, "gpus_per_train_job", kind=int)
    single = [b for b in backends if b.split("+")[0] in backend_names and b.split("+")[0] not in data_parallel]
    if gpus is not None and gpus > 1 and single:
        # Their runs would use the first GPU of the lease and leave the others idle
        problems.append(f"gpus_per_train_job: {gpus} trains each run on {gpus} processes (data parallel), which "
                        f"{', '.join(single)} cannot yet (their trainer or vLLM engine assumes one process); drop "
                        f"them from backends, or set gpus_per_train_job: 1 (a job per GPU, or several on one with "
                        f"gpu_sharing.jobs_per_gpu)")
    sharing = _get(config, "gpu_sharing", kind=dict) or {}
    if sharing.get("speed_runs") == "last" and sharing.get("memory_gb") is None and (sharing.get("jobs_per_gpu") or 1) > 1:
        problems.append("gpu_sharing.speed_runs: last runs the study's seed after the other seeds, so nothing has "
                        "measured what they need of a GPU; set gpu_sharing.memory_gb (GB a job needs), or use first")
    uses_tiny = config.get("model") == TINY or _get(config, "dataset", "path") == TINY
    if uses_tiny and "tiny" not in config:
        problems.append('tiny: model or dataset.path is "tiny" but the tiny section is missing; add it (see studies/tiny.yaml)')
    elif config.get("model") == TINY and isinstance(config.get("tiny"), dict):
        for key in TINY_MODEL_KEYS:
            if key not in config["tiny"]:
                problems.append(f'tiny.{key}: needed to build the tiny model (model is "tiny"); add it (see studies/tiny.yaml)')
    if config.get("model") == RANDOM:
        problems += _random_model_problems(config.get("random_model"))
    return problems


def architecture_path(value: str) -> Path:
    """A random_model.architecture file: as given (absolute, or from the working directory), else in the project."""
    path = Path(value).expanduser()
    return path if path.is_absolute() or path.exists() else PROJECT / value


def _random_model_problems(section) -> list[str]:
    if not isinstance(section, dict) or not isinstance(section.get("architecture"), str):
        return ['random_model: model is "random" but random_model.architecture is not set; add the section (see '
                'studies/speed-4b.yaml)']
    from .random_model import load_architecture

    path = architecture_path(section["architecture"])
    try:
        architecture = load_architecture(path)
    except FileNotFoundError:
        return [f"random_model.architecture: {section['architecture']} not found (looked in the working directory "
                f"and {PROJECT}); give a config.json such as studies/architectures/qwen3-4b.json"]
    except ValueError as e:
        return [f"random_model.architecture: {e}"]
    size = section.get("tokenizer_size")
    if isinstance(size, int) and size > architecture["vocab_size"]:
        return [f"random_model.tokenizer_size: {size} tokens do not fit the architecture's {architecture['vocab_size']} "
                f"embedding rows; lower it to the real tokenizer's size"]
    return []


# load_dataset builders that read local files named by dataset.data_files
FILE_BUILDERS = ("json", "csv", "parquet", "text", "arrow")


def _looks_like_a_path(model: str) -> bool:
    """A hub id is `name` or `org/name`; anything else (absolute, ./, ~, more parts) is meant as a folder."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or Path(model).exists()


CHAT_TEMPLATE_STUDY = "study"  # chat_template: the original study's answer format (answer_format.CHAT_TEMPLATE)


def chat_template_file(value: str, bases=()) -> Path | None:
    """The file a chat_template setting names, if it names one (relative to `bases`, else as given)."""
    path = Path(value).expanduser()
    for candidate in ([path] if path.is_absolute() else [Path(b) / path for b in bases] + [path]):
        if candidate.is_file():
            return candidate.resolve()
    return None


def is_local(config: dict) -> bool:
    """Model and data come from this machine (the tiny study, a model folder, local data files): no job
    needs the network, so none may use it."""
    model, dataset = config["model"], config["dataset"]
    model_local = model in (TINY, RANDOM) or Path(model).expanduser().exists()
    data_local = dataset["path"] == TINY or Path(dataset["path"]).expanduser().exists() or (
        dataset["path"] in FILE_BUILDERS and bool(dataset.get("data_files")))
    return model_local and data_local


def _files_under(path: Path) -> list[Path]:
    """A file, or every file in a folder (not in hidden folders such as .git or .cache)."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                                                                           p.relative_to(path).parts[:-1]))


def local_input_files(config: dict) -> list[str]:
    """The user's own files that a run reads: their model folder, their data set's folder or files. The train
    rule takes them as inputs, so that Snakemake reruns a job whose model or data changed, and the run cache keys
    on their content. (The built tiny and random models and the tiny data are outputs of rules already.)"""
    found = []
    model = config["model"]
    if model not in (TINY, RANDOM) and Path(model).expanduser().exists():
        found += _files_under(Path(model).expanduser())
    dataset = config["dataset"]
    if dataset["path"] != TINY and Path(dataset["path"]).expanduser().exists():
        found += _files_under(Path(dataset["path"]).expanduser())
    if dataset["path"] in FILE_BUILDERS:
        import glob

        files = dataset.get("data_files") or []  # a path or a pattern (the schema takes one string)
        for name in [files] if isinstance(files, str) else files:
            if "://" not in name:
                found += sorted(Path(p) for p in glob.glob(str(Path(name).expanduser())) if Path(p).is_file())
    return [str(p) for p in dict.fromkeys(found)]


def _local_data_problems(dataset: dict) -> list[str]:
    """The data file of a file builder: there, not empty, with the prompt and answer columns (json lines, csv)."""
    files = dataset.get("data_files")
    if not files:
        return [f'dataset.data_files: the "{dataset["path"]}" builder reads local files; name them in dataset.data_files']
    problems = []
    columns = [dataset.get("prompt_column", "prompt"), dataset.get("answer_column", "solution")]
    for name in [files] if isinstance(files, str) else files:
        path = Path(name).expanduser()
        if any(c in name for c in "*?[") or "://" in name:
            continue  # a pattern or remote URL: load_dataset resolves it
        if not path.is_file():
            problems.append(f"dataset.data_files: {name} does not exist; fix the path (relative to the folder snakemake "
                            f"runs in)")
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            first = next((line for line in f if line.strip()), None)
        if first is None:
            problems.append(f"dataset.data_files: {name} is empty; it needs one problem per line (or row)")
            continue
        if dataset["path"] == "json" and first.lstrip().startswith("{"):
            import json

            try:
                present = set(json.loads(first))
            except ValueError:
                continue  # a JSON array file or another layout: load_dataset will say
        elif dataset["path"] == "csv":
            import csv

            with open(path, encoding="utf-8", errors="replace", newline="") as f:
                rows = (row for row in csv.reader(f) if any(cell.strip() for cell in row))
                present, data_row = set(next(rows, [])), next(rows, None)
            if data_row is None:  # load_dataset would only fail after the model is loaded
                problems.append(f"dataset.data_files: {name} has a header but no rows; it needs one problem per row")
                continue
        else:
            continue
        missing = [c for c in columns if c not in present]
        if missing:
            problems.append(f"dataset: {name} has no column {', '.join(map(repr, missing))} (columns: "
                            f"{', '.join(sorted(present))}); set dataset.prompt_column / dataset.answer_column")
    return problems


def input_problems(config: dict) -> list[str]:
    """What can be checked of the model and data before any job, on this machine: local paths and files."""
    problems = []
    model = config["model"]
    if model not in (TINY, RANDOM) and _looks_like_a_path(model):
        path = Path(model).expanduser()
        if not path.is_dir():
            problems.append(f"model: {model} is not a folder; give a model folder (with config.json) or a hub id "
                            f"such as unsloth/Qwen3-4B-Base")
        elif not (path / "config.json").is_file():
            problems.append(f"model: {model} has no config.json; give the folder that save_pretrained wrote")
    dataset = config["dataset"]
    if dataset["path"] in FILE_BUILDERS:
        problems += _local_data_problems(dataset)
    elif dataset["path"] != TINY and dataset["path"].startswith(("/", ".", "~")) and not Path(dataset["path"]).expanduser().exists():
        problems.append(f"dataset.path: {dataset['path']} does not exist; give a data set folder or file, a hub id, or "
                        f"a builder (json, csv, parquet) with dataset.data_files")
    return problems


def check(config: dict, bases=()) -> None:
    """Raises ConfigError listing every problem of `config`, or returns if it describes a runnable study.
    `bases`: where a relative reward file or chat template file may lie (the study file's folder, the working
    directory)."""
    from . import backends, rewards

    problems = schema_problems(config)
    problems += study_problems(config, backends.names(), {n: backends.get(n).options for n in backends.names()},
                               tuple(n for n in backends.names() if getattr(backends.get(n), "data_parallel", False)))
    if isinstance(config.get("grpo"), dict):
        problems += grpo_field_problems(config["grpo"])
    if not problems:  # paths are checked once the keys that name them are well-formed
        problems = input_problems(config)
    if not problems:  # the reward code a study names is imported and its functions checked
        written = config.get("rewards") or [rewards.STUDY_SET]
        try:
            specs = rewards.resolved(written, bases)
        except rewards.RewardSpecError as error:
            problems = [f"rewards: {error}"]
        else:
            problems = rewards.problems(specs, (config.get("grpo") or {}).get("reward_weights"), written)
        template = config.get("chat_template")
        if template not in (None, CHAT_TEMPLATE_STUDY) and "{" not in template and chat_template_file(template, bases) is None:
            problems.append(f"chat_template: {template!r} is neither a Jinja template nor a file here; give the file's "
                            f"path, the template itself, \"study\" or null (the model's own)")
    if problems:
        raise ConfigError("the config is not valid:\n  - " + "\n  - ".join(problems))


# GRPOConfig fields the workflow sets for every run itself: a study that sets one is refused, with the reason.
WORKFLOW_OWNED_GRPO = {
    "output_dir": "each run trains in a scratch folder; its statistics file is its result (save_adapters keeps the "
                  "adapter)",
    "max_steps": "`steps` sets it, one run per step count",
    "num_train_epochs": "a run's length is set by `steps`",
    "logging_steps": "the statistics need one log per optimizer step",
    "logging_strategy": "the statistics need one log per optimizer step",
    "save_strategy": "the workflow saves no checkpoints (save_adapters keeps each run's adapter)",
    "run_name": "each run is named {backend}_{steps}_seed{seed} for the trackers",
    "use_cpu": "it follows gpus_per_train_job",
    "bf16": "it follows dtype",
    "fp16": "it follows dtype",
    "use_vllm": "the backend selects the rollout path: choose it in `backends`",
    "vllm_mode": "the backend selects the rollout path: choose it in `backends`",
    "vllm_gpu_memory_utilization": "it is the vLLM backends' option: set backend_options.BACKEND.gpu_memory_utilization",
    "use_transformers_continuous_batching": "the backend selects the rollout path: choose cb_paged in `backends`",
}


def _matches(value, annotation) -> bool:
    """Whether a YAML value fits a dataclass field's annotation (the forms GRPOConfig uses; others pass)."""
    import enum
    import types
    import typing

    origin = typing.get_origin(annotation)
    if annotation is typing.Any or annotation is object:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return value in {m.value for m in annotation} or value in {m.name for m in annotation}
    if origin in (list, tuple) or annotation in (list, tuple):
        args = typing.get_args(annotation)
        return isinstance(value, list) and (not args or all(_matches(v, args[0]) for v in value))
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    return True  # a form this check does not know: GRPOConfig itself judges it


def grpo_field_problems(grpo: dict) -> list[str]:
    """`grpo` keys beyond the schema's: fields of the installed TRL's GRPOConfig, of the field's type, and not one
    the workflow owns. Empty where TRL is not installed here (a planning machine): each train job checks again."""
    known = yaml.safe_load(SCHEMA.read_text())["properties"]["grpo"]["properties"]
    problems = [f"grpo.{key}: set by the workflow, not the study: {why}; remove it"
                for key, why in WORKFLOW_OWNED_GRPO.items() if key in grpo]
    extra = [key for key in grpo if key not in known and key not in WORKFLOW_OWNED_GRPO]
    if not extra:
        return problems
    try:
        import dataclasses
        import typing

        import trl
        from trl import GRPOConfig
    except ImportError:
        return problems
    hints = typing.get_type_hints(GRPOConfig)
    fields = {f.name for f in dataclasses.fields(GRPOConfig) if f.init}
    import difflib

    for key in extra:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=3)
            problems.append(f"grpo.{key}: not a field of trl {trl.__version__}'s GRPOConfig; fix its spelling"
                            + (f" (close: {', '.join(close)})" if close else "") + " or remove it")
        elif not _matches(grpo[key], hints.get(key, typing.Any)):
            problems.append(f"grpo.{key}: {grpo[key]!r} is not of GRPOConfig's type for it ({hints[key]}); fix the value")
    return problems
