"""The study file: read with the line of a YAML error, `--config` overrides over it, the schema's defaults and
its complaints in one short line each (validate checks the rest).
"""

import os
from pathlib import Path, PurePosixPath

import yaml

from ..runtime import paths
from ..runtime.paths import SCHEMA

TINY = "tiny"  # the value of `model` / `dataset.path` that selects the built-in tiny study
RANDOM = "random"  # the value of `model` that builds a real architecture with random weights (random_model)


class ConfigError(ValueError):
    pass


def with_defaults(name: str, section: dict | None) -> dict:
    """A section of the study with the schema's defaults under it (the workflow's config has them filled in by
    the schema; a benchmark, a test or a job that gets its own copy gets them here)."""
    defaults = yaml.safe_load(SCHEMA.read_text())["properties"][name]["default"]
    return {**defaults, **(section or {})}


# grpo settings that act on the loss, the gradient and the optimizer only: what a job that samples at fixed weights
# (the rollout check, the trainer check's batch) does not depend on, so that changing one reruns no such job
OPTIMISATION_ONLY = ("learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio",
                     "weight_decay", "optim", "optim_args", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
                     "beta", "epsilon", "epsilon_high", "delta", "loss_type", "scale_rewards",
                     "mask_truncated_completions", "vllm_importance_sampling_correction", "top_entropy_quantile")


def sampling_settings(settings: dict) -> dict:
    """A job's settings (get_train_settings') without OPTIMISATION_ONLY's grpo keys and the step recorder's."""
    return {**{k: v for k, v in settings.items() if k != "recorder"},
            "grpo": {k: v for k, v in settings["grpo"].items() if k not in OPTIMISATION_ONLY}}


# rollout_check settings only the verdict reads: a rollout-check job does not depend on them (changing one reruns no
# check, only the report)
ROLLOUT_VERDICT_ONLY = ("support_margin", "numerics_bound")


def rollout_check_settings(section: dict | None) -> dict:
    return with_defaults("rollout_check", section)


def study_name(config: dict, path) -> str:
    """The study's name (`name`, else its file's name without .yaml): it groups the runs in the trackers and names
    the study's results folder by default."""
    return config.get("name") or (Path(path).stem if path is not None else "study")


def results_folder(config: dict, path) -> str:
    """The folder of the study's own outputs: `results`, else results/NAME. Never inside a folder every study shares
    (the run cache, the trackers'), whose files a study's outputs would mix with."""
    folder = config.get("results") or f"{paths.RESULTS}/{study_name(config, path)}"
    if "{" in folder or "}" in folder:  # Snakemake would read them as wildcards
        raise ConfigError(f"results: {folder!r} has a brace; name a folder without {{ or }}")
    normal = PurePosixPath(os.path.normpath(folder))
    for shared in paths.SHARED:
        if normal == PurePosixPath(shared) or PurePosixPath(shared) in normal.parents:
            said = "results" if config.get("results") else f"results (by default results/NAME, here {folder})"
            raise ConfigError(f"{said}: {folder!r} lies in {shared}, which every study shares; name a folder of the "
                              "study's own (`results: results/NAME`, or another `name`)")
    return folder


class DuplicateKey(Exception):
    def __init__(self, key, line: int):
        super().__init__(key)
        self.key, self.line = key, line


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key set twice in one mapping (where it keeps the last without a word)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


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
        study = yaml.load(text, Loader=_UniqueKeys)
    except DuplicateKey as e:
        raise ConfigError(f"{path}:{e.line}: {e.key!r} is set twice in one mapping (YAML keeps the last silently); "
                          f"keep one") from None
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




if __name__ == "__main__":  # `python -m grpo_equivalence.study.config results-folder STUDY_FILE` (make report)
    import sys

    if sys.argv[1:2] != ["results-folder"] or len(sys.argv) != 3:
        sys.exit("usage: python -m grpo_equivalence.study.config results-folder STUDY_FILE")
    try:
        print(results_folder(load_study(sys.argv[2]), sys.argv[2]))
    except ConfigError as error:
        sys.exit(f"error: {error}")
