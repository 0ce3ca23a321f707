"""How the verdict behaves on synthetic runs whose answer is known (grpo_equivalence.analysis.calibration).

Runs of both backends share seeds (the study's design: half of a seed's effect on a run is the same for both
backends' runs of that seed), and are judged in pairs at the planned looks (verdict.LOOKS, alpha split between
them). For several numbers of runs per backend, prints:
- how often a candidate that is another seed of the reference is called divergent on at least one of six
  metrics judged together (Holm, every test alike, as a report judges them: the family-wise false alarm; target:
  at most alpha = 5 %);
- how often it is called equivalent on one metric (the chance to confirm equivalence when it holds);
- how often a candidate shifted by exactly the margin is called equivalent (false equivalence; target: at
  most 5 %);
- the shift of the mean, in standard deviations of a run's mean, that is called divergent in 80 % of trials
  (power), with six metrics judged together;
and the planned looks taken as a user takes them (runs added, judged at each look until a verdict).

First, the grid (calibration.grid_rates, GRID_TRIALS comparisons a cell): every correlation of the paired runs from
-0.3 to 0.9 and candidate-to-reference variance ratio from 0.25 to 4, read at every planned look: how often a
correct candidate's family of nine tests is called divergent, and, per margin (1 reference seed SD, estimated as the
verdict does; a fixed margin of 1 reference SD), how often a test at exactly the margin is called equivalent and how
often a correct candidate's test is equivalent by the last look.

Then the shapes (calibration.SHAPES: heavy-tailed and skewed run summaries): the verdict's null, runs distributed
alike up to a shift of the mean, at every correlation; and runs whose spreads differ (variance ratio 1:9, 1 and 9:1)
with equal means, where that null does not hold.

    python benchmarks/verdict_calibration.py [TRIALS] [GRID_TRIALS] [SHAPE_TRIALS]   (defaults 4000, 20000 and 20000;
    the shift search uses TRIALS / 4; TRIALS 0 prints the grids alone, GRID_TRIALS 0 the shapes alone)
"""

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from grpo_equivalence.analysis import calibration, verdict  # noqa: E402

METRICS = 6  # loss, reward, kl, grad_norm, completion_length, entropy
DESIGNS = tuple((n, n) for n in verdict.LOOKS)


def grid(trials: int) -> None:
    print(f"grid: {trials} comparisons a cell, alpha {verdict.ALPHA}, looks {'/'.join(map(str, verdict.LOOKS))}, "
          f"a family of {calibration.FAMILY} tests")
    print("correlation | variance ratio | divergent, correct candidate | sd 1: equivalent at the margin | sd 1: "
          "equivalent by the last look | fixed: equivalent at the margin | fixed: equivalent by the last look")
    for correlation in calibration.CORRELATIONS:
        for ratio in calibration.VARIANCE_RATIOS:
            r = calibration.grid_rates(correlation=correlation, variance_ratio=ratio, trials=trials, seed=20261204)
            cells = [r["false_divergent"]] + [r[m][k] for m in ("sd 1", "absolute 1")
                                              for k in ("false_equivalent", "equivalent_at_last")]
            print(f"{correlation:g} | {ratio:g} | " + " | ".join(f"{100 * c:.2f} %" for c in cells), flush=True)


def shapes(trials: int) -> None:
    print(f"shapes: {trials} comparisons a cell; cells: divergent (family of {calibration.FAMILY}) | sd 1 margin: "
          f"equivalent at the margin | fixed margin: equivalent at the margin")
    print("shape | design | correlation | variance ratio | divergent, correct candidate | sd 1: equivalent at the margin "
          "| fixed: equivalent at the margin")
    for shape in calibration.SHAPES[1:]:
        cells = [(True, c, 1.0) for c in (0.0, 0.3, 0.6, 0.9)] + [(False, c, r) for c in (0.0, 0.6)
                                                                   for r in (1 / 9, 1.0, 9.0)]
        for location, correlation, ratio in cells:
            r = calibration.grid_rates(correlation=correlation, variance_ratio=ratio, trials=trials, seed=20261205,
                                       shape=shape, location=location)
            print(f"{shape} | {'alike up to a shift' if location else 'spreads of their own'} | {correlation:g} | "
                  f"{ratio:.3g} | {100 * r['false_divergent']:.2f} % | {100 * r['sd 1']['false_equivalent']:.2f} % | "
                  f"{100 * r['absolute 1']['false_equivalent']:.2f} %", flush=True)


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    grid_trials = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    if grid_trials:
        grid(grid_trials)
    shapes(int(sys.argv[3]) if len(sys.argv) > 3 else 20000)
    if not trials:
        return
    process = calibration.Process()
    at_margin = verdict.MARGIN * math.sqrt(2)  # the margin, in run-mean standard deviations
    print(f"synthetic runs: {process}; {trials} trials per figure, alpha {verdict.ALPHA}, margin {verdict.MARGIN}")
    print("runs (ref/cand) | divergent, same process, any of 6 | equivalent, same process | equivalent at the margin "
          "| shift divergent 80 % (run-mean SD)")
    for k, m in DESIGNS:
        start = time.perf_counter()
        false_alarm = calibration.any_divergent_rate(process, metrics=METRICS, reference_runs=k, candidate_runs=m,
                                                     trials=trials)
        tests = METRICS
        same = calibration.rates(process, shift_sd=0.0, reference_runs=k, candidate_runs=m, trials=trials, tests=tests)
        margin = calibration.rates(process, shift_sd=at_margin, reference_runs=k, candidate_runs=m, trials=trials,
                                   tests=tests)
        shifts = [calibration.detected_shift(process, reference_runs=k, candidate_runs=m, trials=max(200, trials // 4),
                                             tests=METRICS)]
        print(f"{k}/{m} | {100 * false_alarm:.1f} % | {100 * same[verdict.EQUIVALENT]:.1f} % | "
              f"{100 * margin[verdict.EQUIVALENT]:.1f} % | "
              + " | ".join(f"{shift if shift is not None else '> 20'}" for shift in shifts)
              + f" ({time.perf_counter() - start:.0f} s)", flush=True)
    same = calibration.sequential_rates(process, shift_sd=0.0, trials=trials)
    margin = calibration.sequential_rates(process, shift_sd=at_margin, trials=trials)
    print(f"looks {'/'.join(map(str, verdict.LOOKS))}, stop at the first verdict | divergent, same process: "
          f"{100 * same[verdict.DIVERGENT]:.1f} % | equivalent, same process: {100 * same[verdict.EQUIVALENT]:.1f} % | "
          f"equivalent at the margin: {100 * margin[verdict.EQUIVALENT]:.1f} %", flush=True)


if __name__ == "__main__":
    main()
