"""What each section of the report shows, from the runs and the rollout checks: per step count the runs' speed and
memory, the comparisons with their confounds, each candidate against the reference of its own trainer stack, the
settings and warnings that differ between backends; the rollout check's verdicts; the study's settings."""

import json
import re
import statistics
from pathlib import Path

from ..analysis import runs as run_files
from ..analysis import stats as stats_io
from ..analysis import verdict
from ..analysis.compare import compare, join_family
from ..analysis.summary import step_speed
from .rollout import drops_choices, rollout_from_dir, rollout_section  # noqa: F401 (the report's sections, here)

# A warning that names a sampling setting: the backend may not sample as the study asked, so its
# differences may come from that setting rather than from its rollout engine. Not inside a snake_case name:
# vLLM's "Triton kernel JIT compilation during inference: _topk_topp_kernel" is about speed, not sampling.
SAMPLING_WARNING = re.compile(r"(?<!_)(min_?p|top_?k|top_?p|temperature|repetition_?penalty|do_?sample)(?!_)",
                              re.IGNORECASE)


def confounds(runs: list[dict]) -> list[dict]:
    """Warnings of these runs that name a sampling setting, once each."""
    found = {}
    for run in runs:
        for warning in run.get("warnings") or []:
            if SAMPLING_WARNING.search(warning["message"]):
                found.setdefault(warning["message"], warning)
    return list(found.values())


def stack_comparisons(groups: dict, steps: int, reference: str, *, alpha: float, margin: float,
                      margins: dict | None = None) -> list[dict]:
    """Each candidate whose trainer stack is not the reference's, against the reference of its own stack where the
    study ran it: what is left of a difference once the stack is the same is the rollout's."""
    from ..training.backends import STACK_REFERENCES, stack

    found = []
    for (backend, n), group in sorted(groups.items()):
        own = STACK_REFERENCES.get(stack(backend))
        if n != steps or backend == reference or stack(backend) == stack(reference) or own in (None, backend):
            continue
        if (own, steps) in groups:
            found.append(compare(groups[(own, steps)], group, alpha=alpha, margin=margin, margins=margins))
    return found


def gpu_sharing(runs: dict) -> dict | None:
    """Of one step count's runs ({backend: runs, the study's seed first}): the study-seed runs, whose speed and
    memory the report shows, that had their GPU to themselves, and every run that shared one (None: none did)."""
    from ..analysis.summary import alone_on_gpu

    every = [run for group in runs.values() for run in group]
    if not any(alone_on_gpu(run) is False for run in every):
        return None
    return {"alone": [run_files.label(group[0]) for group in runs.values() if alone_on_gpu(group[0])],
            "shared": [run_files.label(r) for r in every if alone_on_gpu(r) is False]}


def step_tables(summaries: list[dict], comparisons: list[dict], groups: dict, reference: str, *,
                alpha: float = verdict.ALPHA, margin: float = verdict.MARGIN, margins: dict | None = None) -> list[dict]:
    """Per step count: the runs' summaries with % of the reference's speed, the comparisons with their
    verdicts, the confounds of each candidate, each candidate against the reference of its own trainer stack,
    and the settings that differ between the backends. Each comparison is its own Holm family (compare): a user
    switches to one backend at a time, and the calibration's error rates are those of one comparison."""
    from ..training.backends import stack

    tables = []
    for steps in sorted({s["max_steps"] for s in summaries}):
        rows = sorted((s for s in summaries if s["max_steps"] == steps), key=lambda s: (s["backend"] != reference, s["backend"]))
        ref = next((s for s in rows if s["backend"] == reference), None)
        if ref is None:
            raise stats_io.StatsError(f"no {reference} run with {steps} steps: the reference must have run every step count")
        # Speed and memory only from runs that had their GPU to themselves (gpushare); % of the reference on the
        # answer's basis: the median over every run that had its device alone (summary.step_speed)
        comparable = lambda row: row.get("gpu_alone") is not False  # noqa: E731
        skip = ref["median_over_steps"][0] - 1
        base = step_speed(groups.get((reference, steps), []), skip)
        speeds = {row["backend"]: step_speed(groups.get((row["backend"], steps), []), skip, base) for row in rows}
        table_rows = [dict(row, speed_ok=comparable(row), speed=speeds[row["backend"]],
                           pct_of_reference=(speeds[row["backend"]] or {}).get("pct_of_reference")) for row in rows]
        pairs = sorted((c for c in comparisons if c["max_steps"] == steps), key=lambda c: c["candidate"])
        runs = {backend: group for (backend, n), group in groups.items() if n == steps}
        reference_confounds = confounds(runs.get(reference, []))
        for pair in pairs:
            pair["confounds"] = confounds(runs.get(pair["candidate"], [])) + reference_confounds
        primaries = [group[0] for group in runs.values()]
        stacked = stack_comparisons(groups, steps, reference, alpha=alpha, margin=margin, margins=margins)
        for other in stacked:  # a candidate's comparison with its own stack's reference joins its family
            join_family([*(p for p in pairs if p["candidate"] == other["candidate"]), other])
        tables.append({"steps": steps, "rows": table_rows, "pairs": pairs, "differing": differing_settings(primaries),
                       "stack_pairs": stacked, "stacks": {b: stack(b) or NOT_RECORDED for b in sorted(runs)},
                       "backends": sorted(runs), "mismatch": any(row.get("sampler_mismatch") for row in rows),
                       "seeds": {backend: [r["seed"] for r in group] for backend, group in sorted(runs.items())},
                       "kl": kl_definitions(runs), "gpu_sharing": gpu_sharing(runs),
                       "reward_means": reward_means(runs)})
    return tables


def reward_means(runs: dict) -> dict:
    """Per backend, each reward function's mean over its runs of the run's mean over steps (TRL's
    rewards/<name>/mean); a function a run did not log is left out of that backend's."""
    found = {}
    for backend, group in sorted(runs.items()):
        row = {}
        for name in run_files.reward_functions(group):
            values = [run_files.series(r, f"rewards/{name}/mean") for r in group]
            if all(v for v in values):
                row[name] = statistics.fmean(statistics.fmean(v) for v in values)
        found[backend] = row
    return found


def kl_definitions(runs: dict) -> dict:
    """Per backend, the mean over its runs of the kl the verdict judges (the workflow's own, the same for every
    stack) and of the kl its stack logged, each over the last third of the steps as the verdict summarises kl;
    None where a run has none. Where the two differ the stack logs another quantity (Unsloth: per-sequence means)."""
    found = {}
    for backend, group in sorted(runs.items()):
        row = {}
        for name, key in (("computed", "kl"), ("logged", "kl_logged")):
            values = [[s.get(key) for s in r["steps"]] for r in group]
            means = [statistics.fmean(v[len(v) - max(1, len(v) // 3):]) for v in values
                     if v and all(isinstance(x, (int, float)) for x in v)]
            row[name] = statistics.fmean(means) if len(means) == len(group) else None
        found[backend] = row
    return found


def warnings_by_backend(runs: list[dict]) -> dict[str, list[dict]]:
    """Every warning of each backend's runs: source, message, times raised in all, and in how many runs."""
    by_backend: dict[str, dict] = {}
    for run in runs:
        seen = by_backend.setdefault(run["backend"], {})
        if "warnings" not in run:  # a file of another tool, or of a version that did not record them
            continue
        seen.setdefault("recorded", True)
        for warning in run["warnings"]:
            entry = seen.setdefault((warning["source"], warning["message"]), dict(warning, count=0, runs=0))
            entry["count"] += warning["count"]
            entry["runs"] += 1
    return {backend: [w for key, w in found.items() if key != "recorded"] if found.get("recorded") else None
            for backend, found in sorted(by_backend.items())}


# Trainer settings shown in the report's study settings (all are in the statistics files).
STUDY_SETTINGS = (
    "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
    "generation_batch_size", "steps_per_generation", "max_completion_length", "temperature", "top_p", "top_k",
    "min_p", "repetition_penalty", "seed", "beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards",
    "max_grad_norm", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode", "use_transformers_continuous_batching", "transformers_continuous_batching_config",
    "num_iterations", "gradient_checkpointing", "optim", "lr_scheduler_type", "warmup_steps",
    "weight_decay", "mask_truncated_completions", "bf16", "fp16", "max_steps", "logging_steps", "use_cpu",
    "shuffle_dataset", "top_entropy_quantile", "importance_sampling_level", "disable_dropout",
)


# Settings that legitimately differ between runs of one study: not backend differences.
PER_RUN_SETTINGS = ("trainer.max_steps", "trainer.seed", "trainer.data_seed")
NOT_RECORDED = "not recorded"  # an optional field the file does not hold (a metric not logged is NOT_LOGGED)
SHARED_GPU = "shared GPU"  # a speed or memory figure of a run that shared its GPU: not comparable, so not shown


def _settings(effective_config: dict) -> dict:
    """`section.key` -> value for the sections of effective_config (trainer, generation, lora ...)."""
    flat = {}
    for section, value in effective_config.items():
        if isinstance(value, dict):
            flat.update({f"{section}.{key}": v for key, v in value.items()})
        else:
            flat[section] = value
    return flat


def differing_settings(runs: list[dict]) -> list[dict]:
    """Every effective setting whose value is not the same for all the runs given (one per backend, of one
    step count: the runs that are compared), with each backend's value.

    Backends are meant to differ only in the settings that select their rollout path (each run records
    them as `rollout_settings`); those rows are marked as expected, as are transformers' generation
    settings that a backend not generating with transformers (vLLM) does not have. Any other row (a batch
    size, a loss type, gradient checkpointing that a library changed by itself) means the runs did not train
    under the same settings, and the report says so.
    """
    backends = [run["backend"] for run in runs]
    if len(set(backends)) != len(backends):
        raise ValueError(f"one run per backend, got {sorted(backends)}")
    by_backend: dict[str, dict] = {}
    rollout = set()
    for run in runs:
        config = dict(run["effective_config"])
        rollout.update(key if "." in key else f"trainer.{key}" for key in config.pop("rollout_settings", []))
        by_backend[run["backend"]] = {k: v for k, v in _settings(config).items() if k not in PER_RUN_SETTINGS}
    keys = sorted(set().union(*(flat.keys() for flat in by_backend.values())))
    rows = []
    for key in keys:
        values = {backend: flat.get(key, NOT_RECORDED) for backend, flat in sorted(by_backend.items())}
        distinct = {json.dumps(v, sort_keys=True, default=str) for v in values.values()}
        if len(distinct) > 1:
            present = {json.dumps(v, sort_keys=True, default=str) for v in values.values() if v not in (None, NOT_RECORDED)}
            expected = key in rollout or (key.startswith("generation") and len(present) <= 1)
            rows.append({"setting": key, "values": values, "rollout": expected})
    return sorted(rows, key=lambda row: (row["rollout"], row["setting"]))


def reference_run(runs: list[dict], reference: str) -> dict:
    """The reference backend's shortest run: where the report takes the study's settings from."""
    candidates = [r for r in runs if r["backend"] == reference]
    if not candidates:
        raise stats_io.StatsError(f"no run of reference backend {reference!r}; backends: {sorted({r['backend'] for r in runs})}")
    return min(candidates, key=lambda r: r["max_steps"])


def study_settings(reference_stats: dict) -> dict:
    """What the report says of the study, from the reference's shortest run; absent fields are NOT_RECORDED
    (a file of another tool need carry only the contract's required fields)."""
    config = reference_stats["effective_config"]
    env = reference_stats["environment"]
    packages = env.get("packages") if isinstance(env.get("packages"), dict) else {}
    trainer = config.get("trainer") if isinstance(config.get("trainer"), dict) else {}
    lora = config.get("lora") if isinstance(config.get("lora"), dict) else None
    return {"model": reference_stats["model"], "dataset": reference_stats["dataset"], "seed": reference_stats["seed"],
            "trainer": {k: v for k, v in trainer.items() if k in STUDY_SETTINGS},
            "lora": None if lora is None else {k: lora.get(k, NOT_RECORDED) for k in ("r", "lora_alpha", "lora_dropout", "target_modules")},
            "memory_measure": reference_stats.get("memory_measure") or NOT_RECORDED,
            "accelerator": env.get("gpu_name") or ("CPU" if "gpu_name" in env else NOT_RECORDED),
            "gpu_count": env.get("gpu_count"),
            "packages": {name: version for name, version in packages.items() if version},
            "git_commit": env.get("git_commit") or NOT_RECORDED}


def trainer_section(comparisons: list[dict]) -> dict | None:
    """The trainer check's comparisons (checks.trainer_verdict), as the report's trainer section shows them: the
    candidates first, the control (the reference in the other precision) last."""
    if not comparisons:
        return None
    from ..checks.trainer_verdict import NAMES, ORDER, TERMS

    def figures(c, name):
        row = c["quantities"][name]
        return {"ratio": row.get("ratio"), "cosine": row.get("cosine")}

    rows = [{"label": c["backend"] + (" (control)" if c["dtype"] != c["reference_dtype"] else ""),
             "control": c["dtype"] != c["reference_dtype"], "first": NAMES.get(c["first"]) if c["first"] else None,
             "said": c["said"], **{name: figures(c, name) for name in ("loss", "kl_term", "gradient", "update")}}
            for c in comparisons]
    first = comparisons[0]
    return {"reference": first["reference"], "dtype": first["reference_dtype"], "control_dtype": first["control_dtype"],
            "control_built_as": first.get("control_built_as", first["reference"]), "factor": first["factor"],
            "completions": first["completions"], "tokens": first["tokens"],
            "with_advantage": first.get("with_advantage"), "order": [NAMES[n] for n in ORDER],
            "terms": [NAMES[t] for t in TERMS],
            "rows": sorted(rows, key=lambda r: (r["control"], r["label"]))}


def trainer_from_dir(folder: Path) -> dict:
    """trainer_section of the trainer check's comparison files in `folder` (<backend>_vs_<reference>.json)."""
    import json

    paths = sorted(Path(folder).glob("*_vs_*.json"))
    if not paths:
        raise FileNotFoundError(f"no trainer-check comparisons (<backend>_vs_<reference>.json) in {folder}: point "
                                "--trainer at a study's trainer folder (RESULTS/trainer) after its workflow ran")
    return trainer_section([json.loads(p.read_text()) for p in paths])
