"""A candidate backend against the reference at one step count: their runs with the study's seed step by
step, the reference's seed-to-seed noise floor, and a verdict per metric (grpo_equivalence.analysis.verdict)."""

import statistics

from . import verdict
from .runs import aligned, label, logged_steps, reward_functions, series, unjudged_reward_functions
from .stats import StatsError
from .verdict import METRICS, NOT_LOGGED

COMPARED = tuple(METRICS)  # the metrics the report judges, in its column order


def _one_backend(runs: list[dict], role: str) -> None:
    if not runs:
        raise StatsError(f"no {role} run to compare")
    identities = {(r["backend"], r["max_steps"]) for r in runs}
    if len(identities) > 1:
        raise StatsError(f"the {role} runs are of several backends or step counts: {sorted(identities)}; give the runs "
                         f"of one backend and step count")
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) != len(seeds):
        raise StatsError(f"the {role} runs repeat a seed ({seeds}): each run must have its own")


def step_differences(reference: dict, candidate: dict, metric: str) -> dict:
    """max and mean |candidate - reference| over the aligned steps of two runs, or NOT_LOGGED (never 0)."""
    ref, cand = series(reference, metric), series(candidate, metric)
    if ref is None or cand is None:
        return {"status": NOT_LOGGED,
                "not_logged_in": [label(r) for r, s in ((reference, ref), (candidate, cand)) if s is None]}
    ref, cand = aligned([reference, candidate], metric)
    diffs = [abs(c - r) for c, r in zip(cand, ref, strict=True)]
    return {"status": "compared", "max_abs_diff": max(diffs), "mean_abs_diff": statistics.fmean(diffs),
            "at_step": logged_steps(reference, metric)[diffs.index(max(diffs))]}


def compare(reference_runs: list[dict], candidate_runs: list[dict], *, alpha: float = verdict.ALPHA,
            margin: float = verdict.MARGIN, margins: dict | None = None) -> dict:
    """The runs of each backend at one step count, the first of each with the study's seed."""
    _one_backend(reference_runs, "reference")
    _one_backend(candidate_runs, "candidate")
    reference, candidate = reference_runs[0], candidate_runs[0]
    lengths = {label(r): len(r["steps"]) for r in [*reference_runs, *candidate_runs]}
    if len(set(lengths.values())) > 1:
        raise StatsError(f"runs of different length cannot be compared step by step ({lengths}); rerun the shorter")
    logged = [m for m in COMPARED if all(series(r, m) is not None for r in [*reference_runs, *candidate_runs])]
    metrics = {}
    for metric in COMPARED:
        floor = verdict.noise_floor(reference_runs, metric)
        metrics[metric] = {
            **step_differences(reference, candidate, metric),
            # mean over steps of the mean distance between two reference seeds at a step (None: < 2 seeds)
            "seed_floor": statistics.fmean(floor["pairwise_abs_diff"]) if floor else None,
            "verdict": verdict.judge_runs(reference_runs, candidate_runs, metric, alpha=alpha, margin=margin,
                                          margins=margins),
        }
    # Each reward function's mean per step, judged as the total reward is: a backend can trade one for another
    functions = {}
    for name in reward_functions([*reference_runs, *candidate_runs]):
        key = f"rewards/{name}/mean"
        floor = verdict.noise_floor(reference_runs, key)
        functions[name] = {**step_differences(reference, candidate, key),
                           "seed_floor": statistics.fmean(floor["pairwise_abs_diff"]) if floor else None,
                           "verdict": verdict.judge_runs(reference_runs, candidate_runs, key, alpha=alpha,
                                                         margin=margin, margins=margins)}
    # Holm over the metrics of this comparison: its family (a user switches to one backend at a time; see verdict)
    verdict.finalize(*family([(metrics, functions)]))
    return {"reference": reference["backend"], "candidate": candidate["backend"], "max_steps": reference["max_steps"],
            "steps_compared": len(reference["steps"]), "reference_seeds": [r["seed"] for r in reference_runs],
            "candidate_seeds": [r["seed"] for r in candidate_runs], "alpha": alpha, "margin": margin,
            "margins": {m: verdict.margin_words(m, verdict.margin_spec(m, margins, margin)) for m in COMPARED},
            "metrics_judged": logged, "metrics": metrics, "reward_functions": functions,
            "reward_functions_not_judged": unjudged_reward_functions([*reference_runs, *candidate_runs])}


def family(parts: list[tuple[dict, dict]]) -> tuple[list[dict], list[bool]]:
    """The verdicts of the metrics and reward functions of one comparison or more ([(metrics, reward functions)])
    and which are headline tests, as verdict.finalize takes them."""
    verdicts, marks = [], []
    for metrics, functions in parts:
        verdicts += [entry["verdict"] for entry in [*metrics.values(), *functions.values()]]
        marks += [name in verdict.HEADLINE for name in metrics] + [False] * len(functions)
    return verdicts, marks


def join_family(comparisons: list[dict]) -> None:
    """One candidate's comparisons (against the reference and against the reference of its own trainer stack)
    judged as one Holm family: the candidate's question is one, however many references answer it."""
    verdict.finalize(*family([(c["metrics"], c["reward_functions"]) for c in comparisons]))
