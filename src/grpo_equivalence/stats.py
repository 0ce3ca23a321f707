"""One run's statistics file (DESIGN.md's contract): the recorder that writes it and the reader that checks it.

Summaries, comparisons and reports are derived from these files only, so a file written by another tool in
this shape can be summarised, compared and reported as well.
"""

import json
import os
import time
from pathlib import Path

SCHEMA_VERSION = 1
# Per-step keys every statistics file has (null where the trainer did not log the metric).
STEP_KEYS = ("step", "wall_s", "loss", "grad_norm", "reward", "kl", "peak_mem_gb")
# Trainer log keys promoted out of `metrics` into the step record.
PROMOTED = ("loss", "grad_norm", "reward", "kl")
RUN_KEYS = ("schema_version", "backend", "max_steps", "seed", "model", "dataset", "train_wall_s", "peak_mem_gb",
            "steps", "effective_config", "environment")
# Keys of the trainer's closing log (run totals, not a step's figures).
RUN_SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss")


class StatsError(ValueError):
    pass


def make_recorder(memory_probe, synchronize=lambda: None):
    """A TrainerCallback that builds one record per optimizer step.

    Every log dict is merged into the record of the step it belongs to: GRPO logs its metrics in
    several dicts, and keeping only the dict that holds `loss` would drop the others (a trap of the
    original study). Wall time and memory span on_step_begin..on_step_end, which holds generation,
    reward scoring, forward, backward and the optimizer step.
    """
    from transformers import TrainerCallback

    class StepRecorder(TrainerCallback):
        def __init__(self):
            self.records: dict[int, dict] = {}
            self.run_summary: dict = {}
            self._start = None

        def on_step_begin(self, args, state, control, **kwargs):
            synchronize()
            memory_probe.reset()
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize()
            wall = time.perf_counter() - self._start
            record = self.records.setdefault(state.global_step, {"step": state.global_step})
            record["wall_s"] = wall
            record.update(memory_probe.read())

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = dict(logs or {})
            if any(key in logs for key in RUN_SUMMARY_KEYS):
                self.run_summary.update(logs)
                return
            record = self.records.setdefault(state.global_step, {"step": state.global_step})
            record.setdefault("metrics", {}).update(logs)

    return StepRecorder()


def step_records(records: dict[int, dict]) -> list[dict]:
    """Records in step order, with the contract's keys at top level and the rest under `metrics`."""
    steps = []
    for step in sorted(records):
        raw = dict(records[step])
        metrics = raw.pop("metrics", {})
        record = {key: None for key in STEP_KEYS}
        record.update(raw)
        for key in PROMOTED:
            record[key] = metrics.pop(key, None)
        record["metrics"] = metrics
        steps.append(record)
    return steps


def write(path: Path, stats: dict) -> None:
    """Writes atomically: a crash mid-write never leaves a truncated file that looks complete."""
    check(stats, path)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    # NaN is kept as NaN (Python's JSON reads it back) so that a diverged run is recorded as it was and
    # the comparison can refuse it, rather than turning it into null ("not logged").
    tmp.write_text(json.dumps(stats, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def load(path: Path) -> dict:
    path = Path(path)
    try:
        stats = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise StatsError(f"{path}: not valid JSON ({e}); rerun the train job that wrote it") from e
    check(stats, path)
    return stats


def check(stats: dict, path) -> None:
    """Raises StatsError if `stats` breaks the contract: what is wrong, where, and what to do.

    Values are not judged here (a NaN loss is a finding, kept in the file); comparisons refuse them.
    """
    missing = [key for key in RUN_KEYS if key not in stats]
    if missing:
        raise StatsError(f"{path}: missing run key(s) {', '.join(missing)}; not a statistics file of schema {SCHEMA_VERSION}")
    if stats["schema_version"] != SCHEMA_VERSION:
        raise StatsError(f"{path}: schema_version {stats['schema_version']}, expected {SCHEMA_VERSION}")
    numbers = [step.get("step") for step in stats["steps"]]
    if len(set(numbers)) != len(numbers):
        dupes = sorted({n for n in numbers if numbers.count(n) > 1})
        raise StatsError(f"{path}: step(s) {dupes} appear more than once")
    if numbers != list(range(1, len(numbers) + 1)):
        missing_steps = sorted(set(range(1, max(numbers, default=0) + 1)) - set(numbers))
        raise StatsError(f"{path}: steps must run 1..N in order; missing {missing_steps or 'none'}, got {numbers[:10]}...")
    for step in stats["steps"]:
        absent = [key for key in STEP_KEYS if key not in step]
        if absent:
            raise StatsError(f"{path}: step {step['step']} lacks {', '.join(absent)} (use null for a metric not logged)")
