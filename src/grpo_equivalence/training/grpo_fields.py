"""A study's `grpo` keys beyond the schema's: fields of the installed TRL's GRPOConfig, of the field's type, and
not one the workflow sets itself. Checked before any job and again in each train job, against its TRL."""

import importlib.util

import yaml

from ..runtime.paths import SCHEMA

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


# GRPOConfig settings that need more than TRL where the train jobs run: the module, its pip name and what it is. TRL
# raises only once the trainer is built (after the model's load and the job's GPU lease).
NEEDS_PACKAGE = {"use_liger_kernel": ("liger_kernel", "liger-kernel", "Liger's Triton kernels (RMSNorm, SwiGLU, RoPE), "
                                      "for CUDA GPUs only")}


def package_problems(config: dict, backend: str | None = None) -> list[str]:
    """One line per `grpo` setting of NEEDS_PACKAGE that cannot run here: its package missing, or a CPU study. With
    `backend`, the settings that backend trains with (its configuration's over the study's, faults.CONFIGURATIONS)."""
    from .faults import configuration_of, grpo_settings

    own = config.get("grpo") or {}
    grpo = grpo_settings(backend, own) if backend else own
    found = []
    for key, (module, requirement, what) in NEEDS_PACKAGE.items():
        if not grpo.get(key):
            continue
        # where the setting comes from, and how to do without it: the study's grpo, or the backend's configuration
        if own.get(key) == grpo[key]:
            where, drop = f"grpo.{key}", "remove it"
        else:
            where = f"backends: {backend} (configuration {configuration_of(backend)!r}: grpo.{key})"
            drop = f"drop {backend}"
        if config.get("gpus_per_train_job") == 0:
            found.append(f"{where}: {what}, and this study trains on the CPU (gpus_per_train_job: 0); {drop}")
        elif importlib.util.find_spec(module) is None:
            found.append(f"{where} needs {requirement} ({what}) where the train jobs run: pip install "
                         f"{requirement}, or {drop}")
    return found


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

