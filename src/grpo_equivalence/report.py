"""The equivalence report: speed and memory per step count, differences against the reference, settings."""

import json
from pathlib import Path

from . import stats as stats_io
from .compare import COMPARED, NOT_LOGGED, compare
from .summary import DEFAULT_SKIP, summarise

TEMPLATE = Path(__file__).resolve().parents[2] / "report_templates" / "grpo_equivalence.md.j2"


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


def _cell(value) -> str:
    """A value as one Markdown table cell: a `|` would end the cell and a newline the row."""
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


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
    env.filters["cell"] = _cell
    return env.get_template(Path(template).name).render(
        reference=reference, tables=speed_tables(summaries, comparisons, reference), metrics=COMPARED,
        not_logged=NOT_LOGGED, not_recorded=NOT_RECORDED, settings=study_settings(reference_run(runs, reference)),
        differing=differing_settings(runs), backends=sorted({r["backend"] for r in runs}), stats_files=sorted(stats_files))


def load_runs(paths) -> dict:
    """{path: stats} of statistics files given for one report: each valid, whole, named after what it holds,
    and no run given twice. Raises StatsError with one line per problem, naming the files."""
    runs, problems = {}, []
    for path in paths:
        try:
            run = stats_io.load(path)
            stats_io.check_complete(run, path)
            runs[path] = run
        except stats_io.StatsError as error:
            problems.append(str(error))
    problems += stats_io.identity_problems(runs)
    if problems:
        raise stats_io.StatsError("\n".join(problems))
    return runs


def from_stats_dir(stats_dir: Path, reference: str, skip: int = DEFAULT_SKIP, template: Path = TEMPLATE) -> str:
    """The report of every statistics file in `stats_dir` (grpo_<backend>_<steps>.json), as grpo-report makes it."""
    stats_dir = Path(stats_dir)
    if not stats_dir.is_dir():
        raise FileNotFoundError(f"{stats_dir} is not a folder; pass the folder holding the grpo_<backend>_<steps>.json files")
    paths = [p for p in sorted(stats_dir.glob("grpo_*.json")) if not p.name.endswith(".summary.json")]
    if not paths:
        raise FileNotFoundError(f"no statistics files (grpo_<backend>_<steps>.json) in {stats_dir}")
    runs = load_runs(paths)
    reference_run(list(runs.values()), reference)  # fails early, naming the backends found
    refs = {s["max_steps"]: s for s in runs.values() if s["backend"] == reference}
    summaries = [summarise(s, skip) for s in runs.values()]
    comparisons = [compare(refs[s["max_steps"]], s) for s in runs.values()
                   if s["backend"] != reference and s["max_steps"] in refs]
    return render(summaries=summaries, comparisons=comparisons, reference=reference, runs=list(runs.values()),
                  stats_files=[str(p) for p in runs], template=template)
