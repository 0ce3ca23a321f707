"""How the verdict behaves on synthetic runs whose answer is known: how often it calls two seeds of one
process divergent (at most alpha), and how large a shift of the mean it detects.

A synthetic run is a metric's per-step series: a trend shared by every run, a per-run offset (what a seed
changes for a whole run: its LoRA initialisation, its prompts' order, its early samples), of which the share
`shared` is the seed's own and the same for both backends' runs of that seed, and step noise that carries over
from step to step (AR(1)), as training metrics do. The candidate's runs add `shift` standard deviations of a
run mean to every step. Runs of the two backends with the same index share the seed (the study's design).
"""

import math
import random
import statistics
from dataclasses import dataclass

from . import verdict


@dataclass(frozen=True)
class Process:
    steps: int = 30
    run_sd: float = 0.5  # per-run offset
    step_sd: float = 1.0  # step noise
    carry: float = 0.5  # AR(1) coefficient of the step noise
    shared: float = 0.5  # share of the per-run offset's variance that a seed gives both backends' runs alike

    def run(self, rng: random.Random, shift: float = 0.0, seed_offset: float | None = None) -> list[float]:
        """One run; `seed_offset`: its seed's shared offset (None: a seed of its own)."""
        if seed_offset is None:
            seed_offset = self.seed_offset(rng)
        offset = seed_offset + rng.gauss(0, self.run_sd * math.sqrt(1 - self.shared))
        noise, values = 0.0, []
        for t in range(self.steps):
            noise = self.carry * noise + rng.gauss(0, self.step_sd * math.sqrt(1 - self.carry ** 2))
            values.append(1.0 + 0.05 * t + offset + noise + shift)
        return values

    def seed_offset(self, rng: random.Random) -> float:
        return rng.gauss(0, self.run_sd * math.sqrt(self.shared))

    def pair(self, rng: random.Random, reference_runs: int, candidate_runs: int, shift: float = 0.0):
        """Run means of both backends, seeds 0, 1, ... shared: (reference, candidate)."""
        seeds = [self.seed_offset(rng) for _ in range(max(reference_runs, candidate_runs))]
        reference = [statistics.fmean(self.run(rng, 0.0, seeds[i])) for i in range(reference_runs)]
        candidate = [statistics.fmean(self.run(rng, shift, seeds[i])) for i in range(candidate_runs)]
        return reference, candidate

    def run_mean_sd(self) -> float:
        """The standard deviation of a run's mean over its steps (the unit shifts are given in)."""
        n, phi = self.steps, self.carry
        # variance of the mean of an AR(1) series of unit variance: (1/n^2) sum_ij phi^|i-j|
        acf = sum((n - abs(lag)) * phi ** abs(lag) for lag in range(-(n - 1), n)) / n ** 2
        return math.sqrt(self.run_sd ** 2 + self.step_sd ** 2 * acf)


def rates(process: Process, *, shift_sd: float, reference_runs: int, candidate_runs: int, trials: int,
          seed: int = 0, alpha: float = verdict.ALPHA, margin: float = verdict.MARGIN, tests: float = 1) -> dict[str, float]:
    """The share of each verdict over `trials` synthetic comparisons of one metric, the candidate shifted by
    `shift_sd` standard deviations of a run mean (judged as one of `tests` metrics)."""
    rng = random.Random(seed)
    shift = shift_sd * process.run_mean_sd()
    counts = dict.fromkeys((verdict.EQUIVALENT, verdict.DIVERGENT, verdict.INCONCLUSIVE), 0)
    seeds = dict(reference_seeds=list(range(reference_runs)), candidate_seeds=list(range(candidate_runs)))
    for _ in range(trials):
        reference, candidate = process.pair(rng, reference_runs, candidate_runs, shift)
        counts[verdict.judge(reference, candidate, alpha=alpha, margin=margin, tests=tests, **seeds)["verdict"]] += 1
    return {name: count / trials for name, count in counts.items()}


def any_divergent_rate(process: Process, *, metrics: int, reference_runs: int, candidate_runs: int, trials: int,
                       seed: int = 0, headline: int = 0) -> float:
    """How often a candidate that is another seed of the reference is called divergent on at least one of
    `metrics` independent metrics judged together, the first `headline` of them weighted as headline tests."""
    rng = random.Random(seed)
    seeds = dict(reference_seeds=list(range(reference_runs)), candidate_seeds=list(range(candidate_runs)))
    marks = [i < headline for i in range(metrics)]
    hits = 0
    for _ in range(trials):
        judged = [verdict.judge(*process.pair(rng, reference_runs, candidate_runs), **seeds) for _ in range(metrics)]
        hits += any(v["verdict"] == verdict.DIVERGENT for v in verdict.finalize(judged, marks))
    return hits / trials


def family_tests(metrics: int, headline: int, is_headline: bool) -> float:
    """The unweighted family size that gives one test the alpha Holm's first step gives it in a family of `metrics`
    tests, `headline` of them headline tests (verdict.headline_weights)."""
    weights = verdict.headline_weights([i < headline for i in range(metrics)])
    return sum(weights) / weights[0 if is_headline else metrics - 1]


def detected_shift(process: Process, *, reference_runs: int, candidate_runs: int, trials: int, power: float = 0.8,
                   tests: float = 1, seed: int = 0) -> float | None:
    """The smallest shift (in run-mean standard deviations, on a 0.25 grid up to 20) called divergent in at
    least `power` of the trials."""
    for quarter in range(0, 81):
        shift = quarter / 4
        if rates(process, shift_sd=shift, reference_runs=reference_runs, candidate_runs=candidate_runs,
                 trials=trials, seed=seed, tests=tests)[verdict.DIVERGENT] >= power:
            return shift
    return None


def sequential_rates(process: Process, *, shift_sd: float, trials: int, seed: int = 0, alpha: float = verdict.ALPHA,
                     margin: float = verdict.MARGIN) -> dict[str, float]:
    """The planned looks as a user takes them (verdict.LOOKS): runs of both backends with shared seeds are added
    and judged at each look until one gives a verdict. The share of trials ending in each verdict."""
    rng = random.Random(seed)
    shift = shift_sd * process.run_mean_sd()
    last = verdict.LOOKS[-1]
    counts = dict.fromkeys((verdict.EQUIVALENT, verdict.DIVERGENT, verdict.INCONCLUSIVE), 0)
    for _ in range(trials):
        reference, candidate = process.pair(rng, last, last, shift)
        outcome = verdict.INCONCLUSIVE
        for n in verdict.LOOKS:
            outcome = verdict.judge(reference[:n], candidate[:n], alpha=alpha, margin=margin,
                                    reference_seeds=list(range(n)), candidate_seeds=list(range(n)))["verdict"]
            if outcome != verdict.INCONCLUSIVE:
                break
        counts[outcome] += 1
    return {name: count / trials for name, count in counts.items()}
