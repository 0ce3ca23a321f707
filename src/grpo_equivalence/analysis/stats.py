"""One run's statistics file (DESIGN.md's contract): its keys, its strict JSON, and the reader that checks it
(training.recorder records a run in it).

Summaries, comparisons and reports are derived from these files only, so a file written by another tool in
this shape can be summarised, compared and reported as well.
"""

import gzip
import hashlib
import json
import math
import numbers
import os
import re
from pathlib import Path

SCHEMA_VERSION = 1
# Per-step keys every statistics file has (null where the trainer did not log the metric). `kl` is the KL the
# workflow computes the same way for every stack (training.kl); a step may also hold `kl_logged`, the stack's own.
STEP_KEYS = ("step", "wall_s", "loss", "grad_norm", "reward", "kl", "peak_mem_gb")
RUN_KEYS = ("schema_version", "backend", "max_steps", "seed", "model", "dataset", "train_wall_s", "peak_mem_gb",
            "steps", "effective_config", "environment")


class StatsError(ValueError):
    pass


# Per step (optional in the contract): seconds spent in each block that TRL times with its profiling
# contexts (generation, weight sync, rewards, loss), summed over the step; names as TRL gives them,
# "<trainer class>.<block>".
PROFILE = "profile"


# JSON has no NaN or Infinity: a non-finite number the trainer logged (a diverged loss) is written as one of
# these strings, which every reader of this contract turns back into the number. Never null: null means
# "not logged", and a diverged run must stay a diverged run.
NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
# Step values that are numbers (or null where the trainer did not log them, or NON_FINITE markers).
STEP_NUMBERS = ("loss", "grad_norm", "reward", "kl", "kl_logged")
# Keys of a step's `metrics` that the summary and the verdicts compute with: numbers, null or NON_FINITE markers
# (any other key the trainer logged is kept as it was logged).
READ_METRICS = ("completions/mean_length", "completions/max_length", "entropy", "frac_reward_zero_std")
REWARD_METRICS = "rewards/"  # TRL's rewards/<function>/mean and /std: judged and drawn as the others are


def _encode(value):
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # a 0-d tensor or array (a metric logged as torch.tensor(x)): its number, not its str()
    if isinstance(value, numbers.Real) and not isinstance(value, (int, float)):
        value = float(value)  # a numpy or torch scalar, NaN included, is a number here, not its str()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def to_json(value) -> str:
    """Every JSON file of the workflow is written through here: strict JSON, non-finite numbers as NON_FINITE."""
    return json.dumps(_encode(value), indent=1, default=str, allow_nan=False) + "\n"


def digest_file(path) -> Path:
    """Where the train job that wrote a statistics file keeps its sha256 (beside it, hidden from a folder's grpo_*.json)."""
    return Path(path).with_name(f".{Path(path).name}.sha256")


def content_digest(path) -> str:
    """The sha256 of a file's content (FileNotFoundError where there is none)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def record_digest(path) -> None:
    """The sha256 of the statistics file a train job has just written (or restored), beside it."""
    try:
        digest_file(path).write_text(content_digest(path) + "\n")
    except OSError:  # a full disk: the file itself was the job's to write; its digest only tells of later edits
        pass


def edited(path) -> bool:
    """Whether a statistics file's content is not what its train job wrote (False where no digest was kept)."""
    try:
        recorded = digest_file(path).read_text().strip()
    except OSError:
        return False
    return content_digest(path) != recorded


def write(path: Path, stats: dict) -> None:
    """Checks the run against the contract and writes it (write_json)."""
    write_text(path, checked_json(stats, path))


def checked_json(stats: dict, path) -> str:
    """The run as the text of its statistics file, checked against the contract (StatsError otherwise)."""
    encoded = _encode(stats)  # numpy and torch scalars as the numbers they are, before they are checked
    check(encoded, path)
    return to_json(encoded)


def write_json(path: Path, value) -> None:
    """Writes atomically (write_text)"""
    write_text(path, to_json(value))


def write_text(path: Path, text: str) -> None:
    """Writes atomically: a crash or a full disk mid-write never leaves a truncated file that looks complete (nor
    replaces a whole one), and no `.partial` file stays behind when the write fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the file
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: Path, what: str = "statistics file", fix: str = "rerun the train job that wrote it"):
    """The JSON value of `path`, or a StatsError that says what is wrong with the file and what to do."""
    path = Path(path)
    try:
        # a file kept gzipped (a committed example's) reads as the file itself
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StatsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise StatsError(f"{path}: is a folder, not a {what}") from None
    except UnicodeDecodeError:
        raise StatsError(f"{path}: not a text file (binary content), not a {what}; {fix}") from None
    except (OSError, EOFError) as e:
        raise StatsError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        return json.loads(text, parse_constant=lambda name: NON_FINITE[name])  # bare NaN of older files
    except json.JSONDecodeError as e:
        raise StatsError(f"{path}: not valid JSON ({e}); {fix}") from None


def load(path: Path) -> dict:
    stats = read_json(path)
    try:
        check(stats, path)
    except StatsError as e:  # a file the workflow wrote, changed since (its writer checked it): say how to recover
        raise StatsError(f"{e}; fix the file, or delete it: the workflow restores its run from the run cache (or "
                         "trains it again) when an output needs it") from None
    for step in stats["steps"]:  # NON_FINITE markers back to numbers (check made sure they are markers)
        for key in STEP_NUMBERS:
            if isinstance(step.get(key), str):
                step[key] = NON_FINITE[step[key]]
        for key, value in step.get("metrics", {}).items():
            if isinstance(value, str) and value in NON_FINITE:
                step["metrics"][key] = NON_FINITE[value]
    return stats


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _describe(value) -> str:
    return "null" if value is None else f"{type(value).__name__} {json.dumps(value, default=str)[:40]}"


def check(stats, path) -> None:
    """Raises StatsError if `stats` breaks the contract: the file, the step and the field, and what to do.

    A NaN loss is a finding, kept in the file (comparisons refuse it); a value of the wrong kind is not.
    """
    if not isinstance(stats, dict):
        raise StatsError(f"{path}: holds a JSON {type(stats).__name__}, not an object; not a statistics file")
    missing = [key for key in RUN_KEYS if key not in stats]
    if missing:
        raise StatsError(f"{path}: missing run key(s) {', '.join(missing)}; not a statistics file of schema {SCHEMA_VERSION}")
    if stats["schema_version"] != SCHEMA_VERSION:
        raise StatsError(f"{path}: schema_version {stats['schema_version']}, expected {SCHEMA_VERSION}")
    kinds = {"backend": (str, "a backend name"), "model": (str, "a string"), "dataset": (str, "a string"),
             "effective_config": (dict, "an object"), "environment": (dict, "an object"), "steps": (list, "a list")}
    for key, (kind, said) in kinds.items():
        if not isinstance(stats[key], kind) or (kind is str and not stats[key]):
            raise StatsError(f"{path}: {key} is {_describe(stats[key])}, not {said}")
    for section in ("trainer", "generation", "lora"):  # read key by key by the report
        value = stats["effective_config"].get(section)
        if value is not None and not isinstance(value, dict):
            raise StatsError(f"{path}: effective_config.{section} is {_describe(value)}, not an object (or null)")
    for key in ("max_steps", "seed"):
        if not isinstance(stats[key], int) or isinstance(stats[key], bool) or (key == "max_steps" and stats[key] < 1):
            raise StatsError(f"{path}: {key} is {_describe(stats[key])}, not a {'positive ' if key == 'max_steps' else ''}integer")
    if not (_is_number(stats["train_wall_s"]) and math.isfinite(stats["train_wall_s"]) and stats["train_wall_s"] > 0):
        raise StatsError(f"{path}: train_wall_s is {_describe(stats['train_wall_s'])}, not a positive number of seconds")
    if stats["peak_mem_gb"] is not None and not (_is_number(stats["peak_mem_gb"]) and stats["peak_mem_gb"] >= 0):
        raise StatsError(f"{path}: peak_mem_gb is {_describe(stats['peak_mem_gb'])}, not a number of GB (or null)")
    warned = stats.get("warnings", [])
    if not isinstance(warned, list) or not all(
            isinstance(w, dict) and isinstance(w.get("message"), str) and isinstance(w.get("source"), str)
            and isinstance(w.get("count"), int) for w in warned):
        raise StatsError(f"{path}: warnings is not a list of objects with source, message and count")
    for i, step in enumerate(stats["steps"]):
        if not isinstance(step, dict):
            raise StatsError(f"{path}: steps[{i}] is {_describe(step)}, not an object")
    numbers = [step.get("step") for step in stats["steps"]]
    if any(not isinstance(n, int) or isinstance(n, bool) for n in numbers):
        bad = next(n for n in numbers if not isinstance(n, int) or isinstance(n, bool))
        raise StatsError(f"{path}: a step number is {_describe(bad)}, not an integer")
    if len(set(numbers)) != len(numbers):
        dupes = sorted({n for n in numbers if numbers.count(n) > 1})
        raise StatsError(f"{path}: step(s) {dupes} appear more than once")
    if numbers != list(range(1, len(numbers) + 1)):
        missing_steps = sorted(set(range(1, max(numbers, default=0) + 1)) - set(numbers))
        raise StatsError(f"{path}: steps must run 1..N in order; missing {missing_steps or 'none'}, got {numbers[:10]}...")
    for step in stats["steps"]:
        where = f"{path}: step {step['step']}"
        absent = [key for key in STEP_KEYS if key not in step]
        if absent:
            raise StatsError(f"{where} lacks {', '.join(absent)} (use null for a metric not logged)")
        wall = step["wall_s"]
        if not (_is_number(wall) and math.isfinite(wall) and wall > 0):
            raise StatsError(f"{where}: wall_s is {_describe(wall)}, not a positive number of seconds")
        for key in STEP_NUMBERS:
            value = step.get(key)
            if not (value is None or _is_number(value) or value in NON_FINITE):
                raise StatsError(f"{where}: {key} is {_describe(value)}, not a number (null where not logged; "
                                 f"{', '.join(map(repr, NON_FINITE))} for a non-finite value)")
        peak = step["peak_mem_gb"]
        if peak is not None and not (_is_number(peak) and math.isfinite(peak) and peak >= 0):
            raise StatsError(f"{where}: peak_mem_gb is {_describe(peak)}, not a number of GB (or null)")
        if "metrics" in step and not isinstance(step["metrics"], dict):
            raise StatsError(f"{where}: metrics is {_describe(step['metrics'])}, not an object")
        metrics = step.get("metrics", {})
        # the trainer's keys that summaries and verdicts compute with, each reward function's among them
        for key in [*READ_METRICS, *(k for k in metrics if k.startswith(REWARD_METRICS) and k not in READ_METRICS)]:
            value = metrics.get(key)
            if not (value is None or _is_number(value) or value in NON_FINITE):
                raise StatsError(f"{where}: metrics.{key} is {_describe(value)}, not a number (null where not logged; "
                                 f"{', '.join(map(repr, NON_FINITE))} for a non-finite value)")
        profile = step.get(PROFILE, {})
        if not isinstance(profile, dict) or not all(_is_number(v) and v >= 0 for v in profile.values()):
            raise StatsError(f"{where}: {PROFILE} is not an object of seconds per timed block")


def check_complete(stats: dict, path) -> None:
    """A run that stopped before its max_steps is not a run of max_steps steps (and must not be reported as one)."""
    if len(stats["steps"]) != stats["max_steps"]:
        raise StatsError(f"{path}: {len(stats['steps'])} of max_steps={stats['max_steps']} steps recorded: the run "
                         f"stopped early; rerun it, or remove the file")


def check_consistent(stats: dict, path) -> None:
    """The run's totals agree with its steps: the steps' wall times fit in the run's (each step is timed inside
    trainer.train()), and the run's wall time fits between its recorded start and end. A file edited by hand or
    damaged fails here, where its fields one by one look fine."""
    steps_s = sum(step["wall_s"] for step in stats["steps"])
    # Rounding of the recorded figures only: the timers nest, so there is no other slack
    if steps_s > stats["train_wall_s"] * 1.001 + 0.01:
        raise StatsError(f"{path}: its steps took {steps_s:.3f} s but train_wall_s is {stats['train_wall_s']:.3f} s; "
                         f"the file was changed after it was written: rerun the train job that wrote it")
    began, ended = stats.get("train_started_at"), stats.get("train_finished_at")
    if _is_number(began) and _is_number(ended) and ended - began < stats["train_wall_s"] * 0.999 - 0.01:
        raise StatsError(f"{path}: train_wall_s {stats['train_wall_s']:.3f} s is longer than the {ended - began:.3f} s "
                         f"between train_started_at and train_finished_at; rerun the train job that wrote it")


# The statistics file's name, as a regex: grpo_<backend>_<steps>.json, and for a run reseeded to measure
# the noise floor grpo_<backend>_<steps>_seed<seed>.json (paths.STATS, paths.REPLICATE_STATS); either gzipped
# (.json.gz, as a committed example keeps them)
STATS_NAME = re.compile(r"^grpo_(?P<backend>.+?)_(?P<steps>\d+)(?:_seed(?P<seed>\d+))?\.json(?:\.gz)?$")


def identity_problems(runs: dict) -> list[str]:
    """Files whose name disagrees with what they hold, and runs given twice: {path: stats} -> problems.

    A report keyed by backend and step count would otherwise silently keep whichever file sorts last.
    """
    problems, seen = [], {}
    for path, run in runs.items():
        match = STATS_NAME.match(Path(path).name)
        if match is None:
            problems.append(f"{path}: not named grpo_<backend>_<steps>[_seed<seed>].json; rename it after the run it holds")
            continue
        said = {"backend": match["backend"], "max_steps": int(match["steps"])}
        if match["seed"] is not None:
            said["seed"] = int(match["seed"])
        for key, value in said.items():
            if run[key] != value:
                problems.append(f"{path}: its name says {key} {value}, the file holds {key} {run[key]}; rename the file "
                                f"or fix its {key}")
        identity = (run["backend"], run["max_steps"], run["seed"])
        if identity in seen:
            problems.append(f"{seen[identity]} and {path} are both {run['backend']} x {run['max_steps']} steps with seed "
                            f"{run['seed']}: keep one of them")
        seen.setdefault(identity, path)
    return problems

