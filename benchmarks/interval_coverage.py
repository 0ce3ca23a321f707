"""How often the report's intervals hold the true effect (grpo_equivalence.analysis.calibration.interval_coverage).

Each verdict gives its paired effect with a repeated confidence interval at the look it was read at. On synthetic
run summaries whose true difference is known, over docs/verdicts.md's grid (the paired runs' correlation -0.3 to
0.9, the candidate's variance over the reference's 0.25 to 4, normal summaries) and its shapes (heavy-tailed and
skewed summaries, runs alike up to a shift, and runs with spreads of their own), prints the share of comparisons
whose intervals held the truth at every planned look together, and the lowest share at any one look.

    python benchmarks/interval_coverage.py [TRIALS]   (default 20000 comparisons a cell)
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from grpo_equivalence.analysis import calibration, verdict  # noqa: E402

SEED = 20261207


def cells():
    """(shape, location, correlation, variance ratio) of every cell: the grid, then the shapes as verdicts.md has them."""
    for correlation in calibration.CORRELATIONS:
        for ratio in calibration.VARIANCE_RATIOS:
            yield "normal", False, correlation, ratio
    for shape in calibration.SHAPES[1:]:
        for correlation in (0.0, 0.3, 0.6, 0.9):
            yield shape, True, correlation, 1.0
        for correlation in (0.0, 0.6):
            for ratio in (1 / 9, 1.0, 9.0):
                yield shape, False, correlation, ratio


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    start = time.perf_counter()
    print(f"{trials} comparisons a cell, alpha {verdict.ALPHA}, looks {'/'.join(map(str, verdict.LOOKS))}, the true "
          f"difference 0.5 reference SD")
    print("| Shape | Runs | Correlation | Variance ratio | Held at every look | Lowest at one look |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for shape, location, correlation, ratio in cells():
        found = calibration.interval_coverage(correlation=correlation, variance_ratio=ratio, trials=trials, seed=SEED,
                                              shape=shape, location=location)
        design = "alike up to a shift" if location else ("normal" if shape == "normal" else "spreads of their own")
        print(f"| {shape} | {design} | {correlation:g} | {ratio:.3g} | {100 * found['every_look']:.2f} % | "
              f"{100 * found['lowest_look']:.2f} % |", flush=True)
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
