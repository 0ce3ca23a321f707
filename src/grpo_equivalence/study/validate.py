"""Checks of the study that run before any job: the JSON schema, then what a schema cannot say.

Each problem is reported with the key it concerns and how to fix it; all problems are reported at once,
so that a user fixes the config in one go rather than one error per run.
"""

from ..training.grpo_fields import grpo_field_problems
from .config import RANDOM, TINY, ConfigError, schema_problems
from .inputs import CHAT_TEMPLATE_STUDY, chat_template_file, data_columns, data_rows, input_problems, \
    random_model_problems

TINY_MODEL_KEYS = ("hidden_size", "num_layers", "prime_steps", "prime_batch_size", "prime_learning_rate")


def _get(config: dict, *keys, kind=object):
    """config[k1][k2]... if present and of `kind`, else None: cross-field checks skip what the schema rejects."""
    value = config
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def study_problems(config: dict, backend_names: list[str], backend_options: dict[str, dict],
                   data_parallel: tuple[str, ...] = (), flags: dict[str, tuple] | None = None) -> list[str]:
    """Cross-field checks, given the known backends, the options each one accepts (and of them the `flags`, true or
    false) and those that train a run on several processes (data_parallel). Each check runs on what is
    well-formed, so that a schema error elsewhere does not hide these."""
    problems = []
    backends = [b for b in (_get(config, "backends", kind=list) or []) if isinstance(b, str)]
    from ..training.faults import CONFIGURATIONS, FAULTS, fault_of, split

    for name in backends:
        base, fault = split(name)
        if name.endswith("+"):
            problems.append(f"backends: {name!r} has a '+' and no fault after it; write {base!r}, or {base}+FAULT with "
                            f"FAULT among {', '.join(FAULTS)}")
            continue
        if base not in backend_names:
            problems.append(f"backends: unknown backend {base!r}; choose among {', '.join(backend_names)}")
        if fault is not None and fault not in FAULTS and fault not in CONFIGURATIONS:
            problems.append(f"backends: {name!r} names an unknown fault {fault!r}; choose among {', '.join(FAULTS)} "
                            f"(BACKEND+FAULT), or a configuration among {', '.join(CONFIGURATIONS)} "
                            f"(BACKEND+CONFIGURATION), or drop it")
    from ..training.backends import stack
    from ..training.backends.base import TRL_PEFT

    lora = config.get("lora") if isinstance(config.get("lora"), dict) else {}
    for name in backends:
        base, suffix = split(name)
        if suffix not in CONFIGURATIONS:
            continue
        if base in backend_names and stack(base) != TRL_PEFT:
            problems.append(f"backends: {name!r}: a configuration applies to the TRL + PEFT backends, not to "
                            f"{base!r} (its stack brings kernels and adapters of its own); drop it")
        needs = set(CONFIGURATIONS[suffix].get("options", {}))
        if base in backend_names and needs - set(backend_options[base]):
            takes = [b for b in backend_names if needs <= set(backend_options[b])]
            problems.append(f"backends: {name!r}: configuration {suffix!r} sets {', '.join(sorted(needs))}, an option "
                            f"of {', '.join(takes)} only; drop it, or use {' or '.join(f'{b}+{suffix}' for b in takes)}")
        if CONFIGURATIONS[suffix]["shared_inputs"] and lora.get("lora_dropout", 0) != 0:
            problems.append(f"backends: {name!r} shares the adapters' bfloat16 input, which needs lora.lora_dropout: "
                            f"0.0 (dropout in float32 then rounded is not dropout in bfloat16); set it, or drop {name!r}")
    if any(split(name)[0] == "native" for name in backends) and isinstance(config.get("grpo"), dict):
        from ..training.decoder.sampling import study_problems as native_problems

        problems += [f"grpo: backend 'native' samples with temperature, top_k, top_p and min_p only; this study also "
                     f"sets {', '.join(found)}: remove them, or drop 'native'" for found in [native_problems(
                         config["grpo"])] if found]
    rows = data_rows(config) if isinstance(config.get("dataset"), dict) else None
    batch, generations = _get(config, "grpo", "per_device_train_batch_size", kind=int), \
        _get(config, "grpo", "num_generations", kind=int)
    if rows is not None and batch and generations:
        accumulation = _get(config, "grpo", "gradient_accumulation_steps", kind=int) or 1
        processes = max(1, _get(config, "gpus_per_train_job", kind=int) or 1)
        prompts = max(1, batch * accumulation * processes // generations)
        if rows < prompts:
            problems.append(f"dataset: {rows} problem(s), fewer than one step's {prompts} prompts "
                            f"(per_device_train_batch_size x gradient_accumulation_steps / num_generations): a run would "
                            f"train 0 steps; give more problems, or a smaller batch")
    completion, sequence = _get(config, "grpo", "max_completion_length", kind=int), _get(config, "max_seq_length", kind=int)
    if completion and sequence and completion >= sequence:
        problems.append(f"grpo.max_completion_length: {completion} tokens leave no room for a prompt within "
                        f"max_seq_length {sequence} (a static KV cache is sized by it); raise max_seq_length above the "
                        f"longest prompt plus {completion}, or lower max_completion_length")
    for side in ("reference", "others"):
        if _get(config, "replicates", side, kind=int) == 2:
            problems.append(f"replicates.{side}: 2 runs reach no planned look of the training verdict (the first is at 3 "
                            f"runs of each backend): set 3 for a verdict, or 1 for speed and memory alone")
    from ..analysis.margins import LOG_SCALE

    for metric, spec in (_get(config, "verdict", "margins", kind=dict) or {}).items():
        if isinstance(spec, dict) and "ratio" in spec and metric not in LOG_SCALE:
            problems.append(f"verdict.margins.{metric}: a ratio applies to the metrics summarised as logs "
                            f"({', '.join(LOG_SCALE)}); give {metric} an absolute margin or an sd margin")
    reference = _get(config, "reference", kind=str)
    if reference is not None and fault_of(reference) is not None and config.get("faulted_reference") is not True:
        problems.append(f"reference: {reference!r} has an injected fault: every verdict would be against a sampler known "
                        f"to be wrong; pick a backend without +FAULT, or set faulted_reference: true to mean it")
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
            elif key in (flags or {}).get(name, ()) and not isinstance(options[key], bool):
                problems.append(f"backend_options.{name}.{key}: {options[key]!r} is neither true nor false; "
                                f"{key}: {backend_options[name][key]}")
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
        problems += random_model_problems(config.get("random_model"))
    return problems


def check(config: dict, bases=()) -> None:
    """Raises ConfigError listing every problem of `config`, or returns if it describes a runnable study.
    `bases`: where a relative reward file or chat template file may lie (the study file's folder, the working
    directory)."""
    from ..training import backends, rewards

    problems = schema_problems(config)
    problems += study_problems(config, backends.names(), {n: backends.get(n).options for n in backends.names()},
                               tuple(n for n in backends.names() if getattr(backends.get(n), "data_parallel", False)),
                               {n: getattr(backends.get(n), "flags", ()) for n in backends.names()})
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
            problems = rewards.problems(specs, (config.get("grpo") or {}).get("reward_weights"), written,
                                        columns=data_columns(config))
        template = config.get("chat_template")
        if template not in (None, CHAT_TEMPLATE_STUDY) and "{" not in template and chat_template_file(template, bases) is None:
            problems.append(f"chat_template: {template!r} is neither a Jinja template nor a file here; give the file's "
                            f"path, the template itself, \"study\" or null (the model's own)")
    if problems:
        raise ConfigError("the config is not valid:\n  - " + "\n  - ".join(problems))

