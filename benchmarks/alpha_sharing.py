"""How a candidate's alpha is best shared between the headline metrics and the others (verdict.HEADLINE_SHARE).

Each candidate's tests form one Holm family (verdict.finalize): its metrics and reward functions. Holm holds the
family's false-divergent rate at alpha whatever the weights; the weights decide which differences it can name. This
benchmark measures, for several shares, how often a candidate that differs from the reference in one metric by
exactly that metric's margin (kl 1.5x, grad_norm 1.25x, the others one reference seed SD: the difference the study
says matters) is called divergent on it, reading at every planned look, at the spreads of a real study: each
metric's margin over the SD of its paired differences, the median over the study's candidates (taken from its
statistics files: the spreads only, not which candidate differed). A metric whose paired differences never vary
(a reward function every run of both earns alike) is left out of the family, as the verdict leaves it.

    python benchmarks/alpha_sharing.py STATS_DIR REFERENCE [TRIALS]   (default 20000 a cell)
"""

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib, run from anywhere or loaded by a test

from benchlib import paired_cells  # noqa: E402  (it puts the project's src/ on the path)

from grpo_equivalence.analysis import sequential, verdict  # noqa: E402

SHARES = (0.8, 0.5, None)  # the headline tests' share of alpha; None: every test alike
SEED = 20261207


def spreads(stats_dir: str, reference: str) -> dict[str, float]:
    """Per metric and reward function, its margin over the SD of the paired differences, the median over the study's
    candidates (benchlib.paired_cells)."""
    found: dict[str, list[float]] = {}
    for cell in paired_cells(stats_dir, reference):
        found.setdefault(cell["metric"], []).append(cell["margin"] / cell["sd"])
    return {key: statistics.median(values) for key, values in found.items()}


def weights(headline: list[bool], share: float | None) -> list[float]:
    count = sum(headline)
    if share is None or count in (0, len(headline)):
        return [1.0] * len(headline)
    return [share / count if h else (1 - share) / (len(headline) - count) for h in headline]


def named(effects: list[float], marks: list[bool], share: float | None, target: int | None, trials: int,
          rng) -> tuple[float, float]:
    """Over `trials` families whose paired differences are normal with SD 1 and means `effects`: how often test
    `target` is called divergent at some look, and how often some other test is (None: any test, the null)."""
    import numpy as np
    from scipy.special import stdtr

    w = weights(marks, share)
    tests, runs = len(effects), verdict.LOOKS[-1]
    d = rng.standard_normal((trials, tests, runs)) + np.asarray(effects)[None, :, None]
    hit, other = np.zeros(trials, dtype=bool), np.zeros(trials, dtype=bool)
    for j, n in enumerate(verdict.LOOKS):
        part = d[:, :, :n]
        t = part.mean(axis=-1) / (part.std(axis=-1, ddof=1) / math.sqrt(n))
        p = 2 * stdtr(n - 1, -np.abs(t))
        for trial in np.flatnonzero(p.min(axis=1) <= verdict.ALPHA):
            rejected = sequential.holm(list(p[trial]), verdict.ALPHA, w,
                                       threshold=lambda i, level, j=j: sequential.nominal(level, j))
            for i, r in enumerate(rejected):
                if r and i == target:
                    hit[trial] = True
                elif r:
                    other[trial] = True
    return float(hit.mean()), float(other.mean())


def main() -> None:
    import numpy as np

    stats_dir, reference = sys.argv[1], sys.argv[2]
    trials = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    found = spreads(stats_dir, reference)
    keys = list(found)
    marks = [key in verdict.HEADLINE for key in keys]
    print(f"{stats_dir}, reference {reference}: a family of {len(keys)} tests ({sum(marks)} headline), {trials} "
          f"families a cell, alpha {verdict.ALPHA}, looks {'/'.join(map(str, verdict.LOOKS))}")
    print("margin over the paired differences' SD: " + ", ".join(f"{k} {v:.2f}" for k, v in found.items()))
    label = lambda s: "equal weights" if s is None else f"headline {s:.0%}"  # noqa: E731
    print("| Metric differing by its margin | " + " | ".join(label(s) for s in SHARES) + " |")
    print("| --- |" + " ---: |" * len(SHARES))
    rng = np.random.default_rng(SEED)
    power = {s: [] for s in SHARES}
    for i, key in enumerate(keys):
        effects = [found[key] if k == i else 0.0 for k in range(len(keys))]
        cells = []
        for share in SHARES:
            hit, _ = named(effects, marks, share, i, trials, rng)
            power[share].append(hit)
            cells.append(f"{100 * hit:.1f} %")
        print(f"| {key}{' (headline)' if marks[i] else ''} | " + " | ".join(cells) + " |", flush=True)
    print("| mean over the metrics | " + " | ".join(f"{100 * statistics.fmean(power[s]):.1f} %" for s in SHARES) + " |")
    nulls = [named([0.0] * len(keys), marks, share, None, trials, rng)[1] for share in SHARES]
    print("| no difference: some test divergent | " + " | ".join(f"{100 * v:.2f} %" for v in nulls) + " |")


if __name__ == "__main__":
    main()
