"""Statistics files read for analysis: the runs given together, grouped by backend and step count, and the
per-step series of the metrics they are judged and drawn on. (Kept apart from `stats`, the contract that
train jobs write through, so that changing how runs are read reruns no training.)"""

import math
import re
from pathlib import Path

from . import stats

# The metrics a run is judged and drawn on, and where each lives in a step record (top level, or the
# trainer's `metrics`).
METRIC_KEYS = {"loss": "loss", "reward": "reward", "kl": "kl", "grad_norm": "grad_norm",
               "completion_length": "completions/mean_length", "entropy": "entropy"}


REWARD_FUNCTION = re.compile(r"^rewards/(?P<name>.+)/mean$")  # TRL's mean of one reward function at a step


def reward_functions(runs: list[dict]) -> list[str]:
    """The reward functions (TRL's rewards/<name>/mean) every step of every run logged, in their first run's order."""
    if not runs:
        return []
    names = [m["name"] for key in (runs[0]["steps"][0].get("metrics") or {}) if (m := REWARD_FUNCTION.match(key))]
    return [n for n in names if all(isinstance((s.get("metrics") or {}).get(f"rewards/{n}/mean"), (int, float))
                                    for r in runs for s in r["steps"])]


def label(run: dict) -> str:
    return f"{run['backend']} x {run['max_steps']} (seed {run['seed']})"


def series(run: dict, metric: str) -> list[float] | None:
    """The metric at every step, None if never logged; logged at some steps only, or not finite: an error."""
    key = METRIC_KEYS.get(metric, metric)
    values = [step.get(key, (step.get("metrics") or {}).get(key)) for step in run["steps"]]
    if all(v is None for v in values):
        return None
    for step, value in zip(run["steps"], values, strict=True):
        if value is None:
            raise stats.StatsError(f"{label(run)}: {metric} is logged at some steps but missing at step {step['step']}")
        if not math.isfinite(value):
            raise stats.StatsError(f"{label(run)}: {metric} is {value} at step {step['step']}; the run diverged, so it "
                             f"cannot be compared (rerun it, or lower the learning rate)")
    return values


def load_runs(paths) -> dict:
    """{path: stats} of statistics files given together (one report, one figure): each valid, whole, named
    after what it holds, and no run given twice. Raises StatsError with one line per problem, naming the files."""
    runs, problems = {}, []
    for path in paths:
        try:
            run = stats.load(path)
            stats.check_complete(run, path)
            stats.check_consistent(run, path)
            runs[path] = run
        except stats.StatsError as error:
            problems.append(str(error))
    problems += stats.identity_problems(runs)
    if problems:
        raise stats.StatsError("\n".join(problems))
    return runs


def group_runs(runs: dict) -> dict[tuple[str, int], list[dict]]:
    """{(backend, steps): runs}, the run with the study's seed (its file name carries no seed) first."""
    groups: dict[tuple[str, int], list] = {}
    for path, run in runs.items():
        replicate = stats.STATS_NAME.match(Path(path).name)["seed"] is not None
        groups.setdefault((run["backend"], run["max_steps"]), []).append((replicate, run["seed"], run))
    return {key: [run for *_, run in sorted(items, key=lambda item: item[:2])] for key, items in groups.items()}
