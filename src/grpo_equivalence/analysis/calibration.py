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

from . import margins, sequential, verdict


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
          seed: int = 0, alpha: float = verdict.ALPHA, margin: float | dict = verdict.MARGIN,
          tests: float = 1) -> dict[str, float]:
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
                       seed: int = 0) -> float:
    """How often a candidate that is another seed of the reference is called divergent on at least one of
    `metrics` independent metrics judged together."""
    rng = random.Random(seed)
    seeds = dict(reference_seeds=list(range(reference_runs)), candidate_seeds=list(range(candidate_runs)))
    hits = 0
    for _ in range(trials):
        judged = [verdict.judge(*process.pair(rng, reference_runs, candidate_runs), **seeds) for _ in range(metrics)]
        hits += any(v["verdict"] == verdict.DIVERGENT for v in verdict.finalize(judged))
    return hits / trials


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
                     margin: float | dict = verdict.MARGIN) -> dict[str, float]:
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


# The grid the verdict is calibrated over: the paired runs' correlation and the candidate's variance over the
# reference's (the example studies measured -0.3 to 0.9 between paired runs), each comparison a family of FAMILY
# tests, as a report with three reward functions has.
CORRELATIONS = (-0.3, 0.0, 0.3, 0.6, 0.9)
VARIANCE_RATIOS = (0.25, 1.0, 4.0)
FAMILY = 9


# The shapes run summaries are drawn in, each standardised to mean 0 and SD 1: normal; heavy-tailed (Student t, 3
# degrees of freedom); skewed (log-normal, sigma 0.5 and 1: a few runs with a reward spike, a KL that grows
# multiplicatively)
SHAPES = ("normal", "t3", "lognormal0.5", "lognormal1")


def standard(rng, shape: str, size):
    """Draws of `shape` (SHAPES), mean 0 and SD 1."""
    import numpy as np

    if shape == "normal":
        return rng.standard_normal(size)
    if shape == "t3":
        return rng.standard_t(3, size) / math.sqrt(3.0)
    if shape.startswith("lognormal"):
        sigma = float(shape.removeprefix("lognormal"))
        mean, sd = math.exp(sigma ** 2 / 2), math.sqrt((math.exp(sigma ** 2) - 1) * math.exp(sigma ** 2))
        return (np.exp(sigma * rng.standard_normal(size)) - mean) / sd
    raise ValueError(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")


def paired_summaries(rng, trials: int, tests: int, *, correlation: float, variance_ratio: float, shift: float = 0.0,
                     shape: str = "normal", location: bool = False):
    """Run summaries of both backends for `trials` comparisons of `tests` independent metrics, verdict.LOOKS[-1]
    shared seeds each: (reference, candidate), arrays of shape (trials, tests, runs). The reference's summaries have
    SD 1; the candidate's SD sqrt(variance_ratio), correlated with the reference's of the same seed, shifted by
    `shift`; both means equal but for the shift, their draws of `shape`. `location`: the candidate's runs are the
    reference's distribution shifted (a seed's part shared, each backend's own part drawn alike: the pairs are
    exchangeable but for the shift), whatever `shape`; variance_ratio must be 1."""
    runs = verdict.LOOKS[-1]
    if location:
        if variance_ratio != 1:
            raise ValueError("a candidate distributed as the reference up to a shift has its variance")
        seed = standard(rng, shape, (trials, tests, runs))
        mine, theirs = (standard(rng, shape, (trials, tests, runs)) for _ in range(2))
        shared, own = math.sqrt(max(correlation, 0.0)), math.sqrt(1 - max(correlation, 0.0))
        return shared * seed + own * mine, shared * seed + own * theirs + shift
    reference = standard(rng, shape, (trials, tests, runs))
    own = standard(rng, shape, (trials, tests, runs))
    candidate = math.sqrt(variance_ratio) * (correlation * reference + math.sqrt(1 - correlation ** 2) * own) + shift
    return reference, candidate


def grid_rates(*, correlation: float, variance_ratio: float, trials: int, seed: int = 0, alpha: float = verdict.ALPHA,
               margins: tuple[dict, ...] = ({"sd": verdict.MARGIN}, {"absolute": 1.0}), shape: str = "normal",
               location: bool = False) -> dict:
    """Read at every planned look, as a user adding runs would (the worst case: a verdict at any look counts):
    - false_divergent: a candidate that trains as the reference does, called divergent on some test of its family
      of FAMILY (Holm, every test alike), at some look;
    and per margin (in reference SDs; an sd margin as verdict takes it, estimated from the reference's runs):
    - false_equivalent: one test whose true difference is exactly the margin, called equivalent at some look;
    - equivalent_at_last: one test of a candidate that trains as the reference does, equivalent by the last look.
    Computed with verdict's boundaries and Holm, vectorised over trials (family_divergent, equivalent_seen); tests/
    test_verdict.py checks that judge and finalize decide such trials alike."""
    import numpy as np

    rng = np.random.default_rng(seed)
    shape = dict(correlation=correlation, variance_ratio=variance_ratio, shape=shape, location=location)
    out = {"false_divergent": float(family_divergent(*paired_summaries(rng, trials, FAMILY, **shape), alpha).mean())}
    for margin in margins:
        kind, value = next(iter(margin.items()))
        true_margin = value * math.sqrt(2) if kind == "sd" else value  # the reference's SD is 1
        name = f"{kind} {value:g}"
        out[name] = {"false_equivalent": float(equivalent_seen(
            *paired_summaries(rng, trials, 1, shift=true_margin, **shape), margin, alpha).mean()),
                     "equivalent_at_last": float(equivalent_seen(
            *paired_summaries(rng, trials, 1, **shape), margin, alpha).mean())}
    return out


def interval_coverage(*, correlation: float, variance_ratio: float, trials: int, seed: int = 0,
                      alpha: float = verdict.ALPHA, shape: str = "normal", location: bool = False,
                      shift: float = 0.5) -> dict:
    """How often the verdict's repeated confidence intervals (verdict.judge: the two-sided boundary of the whole
    alpha at each look) hold the true paired difference `shift` (in reference SDs): at every planned look together
    (a user who reads the interval at whichever look they stop at), and at each look alone (the lowest of them)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    reference, candidate = paired_summaries(rng, trials, 1, correlation=correlation, variance_ratio=variance_ratio,
                                            shift=shift, shape=shape, location=location)
    every, each = np.ones(trials, dtype=bool), []
    for j, n in enumerate(verdict.LOOKS):
        d = candidate[:, 0, :n] - reference[:, 0, :n]
        reach = sequential.boundaries(alpha)[j] * d.std(axis=1, ddof=1) / math.sqrt(n)
        covered = np.abs(d.mean(axis=1) - shift) <= reach
        every &= covered
        each.append(float(covered.mean()))
    return {"every_look": float(every.mean()), "lowest_look": min(each), "by_look": each}


def family_divergent(reference, candidate, alpha: float = verdict.ALPHA):
    """Per trial (arrays of paired_summaries' shape): whether some test of the family is divergent at some planned
    look, each look judging the runs up to it (verdict's Holm and boundaries)."""
    import numpy as np

    divergent = np.zeros(reference.shape[0], dtype=bool)
    for j, n in enumerate(verdict.LOOKS):
        p = _paired_p(reference[:, :, :n], candidate[:, :, :n])
        for trial in np.flatnonzero(~divergent & (p.min(axis=1) <= alpha)):  # Holm can only reject below alpha
            divergent[trial] = any(sequential.holm(list(p[trial]), alpha,
                                                   threshold=lambda i, level, j=j: sequential.nominal(level, j)))
    return divergent


def equivalent_seen(reference, candidate, margin: dict, alpha: float = verdict.ALPHA):
    """Per trial: whether the first test is equivalent at some planned look (verdict's margin and boundaries)."""
    import numpy as np

    seen = np.zeros(reference.shape[0], dtype=bool)
    kind, value = next(iter(margin.items()))
    for j, n in enumerate(verdict.LOOKS):
        d = candidate[:, 0, :n] - reference[:, 0, :n]
        bound = (margins.sd_margin(value, reference[:, 0, :n].std(axis=1, ddof=1), j, alpha) if kind == "sd"
                 else value)
        se = d.std(axis=1, ddof=1) / math.sqrt(n)
        z = sequential.boundaries(verdict.equivalence_alpha(margin, alpha), sides=1)[j]
        seen |= np.abs(d.mean(axis=1)) + z * se < bound
    return seen


def _paired_p(reference, candidate):
    """Two-sided p of the paired t-test per trial and test (the last axis: the pairs)."""
    import numpy as np
    from scipy.special import stdtr

    d = candidate - reference
    n = d.shape[-1]
    t = d.mean(axis=-1) / (d.std(axis=-1, ddof=1) / math.sqrt(n))
    return 2 * stdtr(n - 1, -np.abs(t))
