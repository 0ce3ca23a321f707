"""Checks of the study's config that run before any job: the JSON schema, then what a schema cannot say.

Each problem is reported with the key it concerns and how to fix it; all problems are reported at once,
so that a user fixes the config in one go rather than one error per run.
"""

from pathlib import Path

import yaml

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
TINY = "tiny"  # the value of `model` / `dataset.path` that selects the built-in tiny study


class ConfigError(ValueError):
    pass


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
        else:
            problems.append(f"{where}: {error.message}")
    return problems


def study_problems(config: dict, backend_names: list[str], backend_options: dict[str, dict]) -> list[str]:
    """Cross-field checks, given the known backends and the options each one accepts."""
    problems = []
    backends = config["backends"]
    for name in backends:
        if name not in backend_names:
            problems.append(f"backends: unknown backend {name!r}; choose among {', '.join(backend_names)}")
    if config["reference"] not in backends:
        problems.append(
            f"reference: {config['reference']!r} is not among backends {backends}; "
            f"add it to backends or pick one of them as reference"
        )
    warmup = config["median_skip_steps"]
    for steps in config["steps"]:
        if steps <= warmup:
            problems.append(
                f"steps: {steps} leaves no step for the median step time after median_skip_steps={warmup}; "
                f"use at least {warmup + 1} steps or lower median_skip_steps"
            )
    grpo = config["grpo"]
    batch = grpo["per_device_train_batch_size"] * grpo["gradient_accumulation_steps"]
    if batch % grpo["num_generations"]:
        problems.append(
            f"grpo.num_generations: {grpo['num_generations']} does not divide the generation batch "
            f"per_device_train_batch_size x gradient_accumulation_steps = {batch}; make the batch a multiple "
            f"of num_generations (a group must fit in one batch)"
        )
    for name, options in (config.get("backend_options") or {}).items():
        if name not in backend_names:
            problems.append(f"backend_options.{name}: unknown backend; choose among {', '.join(backend_names)}")
            continue
        for key in options:
            if key not in backend_options[name]:
                known = ", ".join(backend_options[name]) or "none"
                problems.append(f"backend_options.{name}.{key}: unknown option of {name} (known: {known})")
    uses_tiny = config["model"] == TINY or config["dataset"]["path"] == TINY
    if uses_tiny and "tiny" not in config:
        problems.append('tiny: model or dataset.path is "tiny" but the tiny section is missing; add it (see studies/tiny.yaml)')
    return problems


def check(config: dict) -> None:
    """Raises ConfigError listing every problem of `config`, or returns if it describes a runnable study."""
    from . import backends

    problems = schema_problems(config)
    if not problems:
        problems = study_problems(config, backends.names(), {n: backends.get(n).options for n in backends.names()})
    if problems:
        raise ConfigError("the config is not valid:\n  - " + "\n  - ".join(problems))
