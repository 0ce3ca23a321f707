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
    """The reward functions (TRL's rewards/<name>/mean) every step of every run logged as a finite number, in their
    first run's order: those judged (unjudged_reward_functions says why the others are not)."""
    unjudged = unjudged_reward_functions(runs)
    return [name for name in _logged_functions(runs) if name not in unjudged]


def _logged_functions(runs: list[dict]) -> list[str]:
    names = {}
    for run in runs:
        for key in (run["steps"][0].get("metrics") or {}) if run["steps"] else ():
            if m := REWARD_FUNCTION.match(key):
                names.setdefault(m["name"], None)
    return list(names)


def unjudged_reward_functions(runs: list[dict]) -> dict[str, str]:
    """{name: why} for each reward function some run logged that cannot be judged: not logged at a step of a run, or
    NaN there (TRL's mean over no completion: the function returned None or NaN for every one of them)."""
    why = {}
    for name in _logged_functions(runs):
        for run in runs:
            values = [(s["step"], (s.get("metrics") or {}).get(f"rewards/{name}/mean")) for s in run["steps"]]
            present = [(step, value) for step, value in values if value is not None]
            nan = [step for step, value in present if isinstance(value, float) and math.isnan(value)]
            if not present:  # absent at some steps only is a metric TRL logs at the steps that sampled
                why[name] = f"not logged by {label(run)}"
            elif nan:
                where = "at every step" if len(nan) == len(present) else f"at step(s) {', '.join(map(str, nan[:5]))}"
                why[name] = (f"scored no completion {where} of {label(run)} (it returned None or NaN for every "
                             f"completion there)")
            if name in why:
                break
    return why


def label(run: dict) -> str:
    return f"{run['backend']} x {run['max_steps']} (seed {run['seed']})"


def logged_steps(run: dict, metric: str) -> list[int]:
    """The steps at which the run logged `metric`: every step, or some (with grpo.num_iterations above 1 TRL logs its
    rollout's metrics, reward and completion length among them, at the steps that sampled only)."""
    key = METRIC_KEYS.get(metric, metric)
    return [step["step"] for step in run["steps"] if step.get(key, (step.get("metrics") or {}).get(key)) is not None]


def series(run: dict, metric: str) -> list[float] | None:
    """The metric at the steps that logged it (logged_steps), None if never logged; not finite: an error. A metric
    absent at a step is absent there, not 0 and not an error."""
    key = METRIC_KEYS.get(metric, metric)
    pairs = [(step, step.get(key, (step.get("metrics") or {}).get(key))) for step in run["steps"]]
    values = [value for _, value in pairs if value is not None]
    if not values:
        return None
    for step, value in pairs:
        if value is not None and not math.isfinite(value):
            raise stats.StatsError(f"{label(run)}: {metric} is {value} at step {step['step']}; the run diverged, so it "
                             f"cannot be compared (rerun it, or lower the learning rate)")
    return values


def aligned(runs: list[dict], metric: str) -> list[list[float]]:
    """The runs' series of `metric`, logged at the same steps in every run (runs of one study are); a StatsError
    naming the runs otherwise."""
    steps = [logged_steps(run, metric) for run in runs]
    if any(s != steps[0] for s in steps):
        raise stats.StatsError(f"{metric} is logged at other steps in {', '.join(label(r) for r in runs)} "
                               f"({'; '.join(str(s[:6]) for s in steps)}): compare runs trained with the same settings")
    return [series(run, metric) for run in runs]


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
