"""The equivalence report: speed and memory per step count, differences against the reference, settings."""

import json
import re
from pathlib import Path

from . import stats as stats_io
from .compare import COMPARED, NOT_LOGGED, compare
from .summary import DEFAULT_SKIP, summarise

TEMPLATE = Path(__file__).resolve().parents[2] / "report_templates" / "grpo_equivalence.md.j2"
STATS_NAME = re.compile(r"^grpo_(?P<backend>.+)_(?P<steps>\d+)\.json$")  # paths.STATS, as a regex


def speed_tables(summaries: list[dict], comparisons: list[dict], reference: str) -> list[dict]:
    """One table per step count: the runs' summaries with % of the reference's speed, and its comparisons."""
    tables = []
    for steps in sorted({s["max_steps"] for s in summaries}):
        rows = sorted((s for s in summaries if s["max_steps"] == steps), key=lambda s: (s["backend"] != reference, s["backend"]))
        ref = next((s for s in rows if s["backend"] == reference), None)
        if ref is None:
            raise stats_io.StatsError(f"no {reference} run with {steps} steps: the reference must have run every step count")
        table_rows = [dict(row, pct_of_reference=100.0 * ref["median_step_s"] / row["median_step_s"]) for row in rows]
        pairs = sorted((c for c in comparisons if c["max_steps"] == steps), key=lambda c: c["candidate"])
        tables.append({"steps": steps, "rows": table_rows, "pairs": pairs})
    return tables


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
PER_RUN_SETTINGS = ("trainer.max_steps",)


NOT_RECORDED = "not recorded"  # an optional field the file does not hold (a metric not logged is NOT_LOGGED)


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
    """Every effective setting whose value is not the same for all backends, with each backend's value.

    Backends are meant to differ only in the settings that select their rollout path (each run records
    them as `rollout_settings`); those rows are marked as expected. Any other row (a batch size, a loss
    type, gradient checkpointing that a library changed by itself) means the runs did not train under
    the same settings, and the report says so.
    """
    by_backend: dict[str, dict] = {}
    rollout = set()
    for run in sorted(runs, key=lambda r: r["max_steps"]):
        config = dict(run["effective_config"])
        rollout.update(f"trainer.{key}" for key in config.pop("rollout_settings", []))
        flat = {k: v for k, v in _settings(config).items() if k not in PER_RUN_SETTINGS}
        by_backend.setdefault(run["backend"], {}).update(flat)
    keys = sorted(set().union(*(flat.keys() for flat in by_backend.values())))
    rows = []
    for key in keys:
        values = {backend: flat.get(key, NOT_RECORDED) for backend, flat in sorted(by_backend.items())}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            rows.append({"setting": key, "values": values, "rollout": key in rollout})
    return sorted(rows, key=lambda row: (row["rollout"], row["setting"]))


def reference_run(runs: list[dict], reference: str) -> dict:
    """The reference backend's shortest run: where the report takes the study's settings from."""
    candidates = [r for r in runs if r["backend"] == reference]
    if not candidates:
        raise stats_io.StatsError(f"no run of reference backend {reference!r}; backends: {sorted({r['backend'] for r in runs})}")
    return min(candidates, key=lambda r: r["max_steps"])


def study_settings(reference_stats: dict) -> dict:
    config = reference_stats["effective_config"]
    return {"model": reference_stats["model"], "dataset": reference_stats["dataset"], "seed": reference_stats["seed"],
            "trainer": {k: v for k, v in config.get("trainer", {}).items() if k in STUDY_SETTINGS}, "lora": config.get("lora"), "generation": config.get("generation"),
            "memory_measure": reference_stats.get("memory_measure"), "environment": reference_stats["environment"]}


def _num(value, digits: int = 3) -> str:
    if value is None:
        return NOT_LOGGED
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-3 and value != 0 else f"{value:.{digits}f}"
    return str(value)


def render(*, summaries: list[dict], comparisons: list[dict], reference: str, runs: list[dict],
           stats_files: list[str], template: Path = TEMPLATE) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(template).parent)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["num"] = _num
    return env.get_template(Path(template).name).render(
        reference=reference, tables=speed_tables(summaries, comparisons, reference), metrics=COMPARED,
        not_logged=NOT_LOGGED, not_recorded=NOT_RECORDED, settings=study_settings(reference_run(runs, reference)),
        differing=differing_settings(runs), backends=sorted({r["backend"] for r in runs}), stats_files=sorted(stats_files))


def from_stats_dir(stats_dir: Path, reference: str, skip: int = DEFAULT_SKIP, template: Path = TEMPLATE) -> str:
    """The report of every statistics file in `stats_dir` (grpo_<backend>_<steps>.json), as grpo-report makes it."""
    runs = {}
    for path in sorted(Path(stats_dir).glob("grpo_*.json")):
        match = STATS_NAME.match(path.name)
        if match is None:  # summaries (.summary.json) and anything else
            continue
        runs[path] = stats_io.load(path)
    if not runs:
        raise FileNotFoundError(f"no statistics files (grpo_<backend>_<steps>.json) in {stats_dir}")
    reference_run(list(runs.values()), reference)  # fails early, naming the backends found
    refs = {s["max_steps"]: s for s in runs.values() if s["backend"] == reference}
    summaries = [summarise(s, skip) for s in runs.values()]
    comparisons = [compare(refs[s["max_steps"]], s) for s in runs.values()
                   if s["backend"] != reference and s["max_steps"] in refs]
    return render(summaries=summaries, comparisons=comparisons, reference=reference, runs=list(runs.values()),
                  stats_files=[str(p) for p in runs], template=template)
