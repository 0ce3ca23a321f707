"""Does advice followed reach a decision at the rate it states? (grpo_equivalence.analysis.advice)

Synthetic studies whose truth is known: paired run summaries (reference and candidate, shared seeds) with a true
difference of EFFECTS times the margin and paired differences of SPREADS times the margin, one test of a family of
FAMILY; or, given a study's statistics files, the truths that study measured: every candidate's every metric, its
mean paired difference and SD (in margins) taken as true (benchlib.paired_cells), each equally often. Each study is judged at its first look; where the verdict is open and the report advises a later look, the
same study is continued to that look (more runs of the same process) and judged there. Per cell: how often advice was
given, the chance it stated (mean), and how often the look it named decided (equivalent or divergent). Fixed margins
(the ratio and absolute margins; an sd margin states its chance with the margin's estimate as now).

    python benchmarks/advice_followed.py [TRIALS] [START] [STATS_DIR REFERENCE]   (default 4000 studies a cell, judged
    first at START = 3 runs; the grid above without STATS_DIR)

Then the calibration: the studies advised, pooled over the cells, by the chance stated (in bins of 10 points), the
rate their advised looks decided.
"""

import statistics
import sys
from pathlib import Path
import time

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib, run from anywhere or loaded by a test

from benchlib import paired_cells  # noqa: E402  (it puts the project's src/ on the path)

from grpo_equivalence.analysis import advice, verdict  # noqa: E402

EFFECTS = (0.0, 0.5, 1.0, 1.5)  # the true difference, in margins
SPREADS = (0.5, 1.0, 2.0)  # the paired differences' SD, in margins
FAMILY = 9
SEED = 20261208


def study(rng, effect: float, spread: float, start: int) -> tuple[float, bool] | None:
    """One study: the chance the advice stated at the first judged look and whether the advised look decided; None
    where no look was advised (decided already, or no later look reaches advice.FLOOR)."""
    runs = verdict.LOOKS[-1]
    reference = [rng.gauss(0, 1) for _ in range(runs)]
    candidate = [r + rng.gauss(effect, spread) for r in reference]
    seeds = list(range(runs))
    margin = {"absolute": 1.0}

    def judged(n):
        return verdict.judge(reference[:n], candidate[:n], margin=margin, tests=FAMILY, reference_seeds=seeds[:n],
                             candidate_seeds=seeds[:n])

    first = judged(start)
    found = advice.advise("reward", {**first, "family_size": FAMILY})
    if not found or not found["look"]:
        return None
    later = judged(found["look"]["runs"])
    return found["look"]["either"], later["verdict"] != verdict.INCONCLUSIVE


def main() -> None:
    import random

    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    start = int(sys.argv[2]) if len(sys.argv) > 2 else verdict.LOOKS[0]
    if len(sys.argv) > 4:
        truths = [(abs(c["mean"]) / c["margin"], c["sd"] / c["margin"]) for c in paired_cells(sys.argv[3], sys.argv[4])]
        where = f"the {len(truths)} cells of {sys.argv[3]} (reference {sys.argv[4]}) taken as true"
    else:
        truths, where = [(e, s) for e in EFFECTS for s in SPREADS], "the grid"
    rng = random.Random(SEED)
    began = time.perf_counter()
    print(f"{trials} studies a cell of {where}, first judged at {start} runs, a family of {FAMILY}, fixed margin, "
          f"advice at {advice.POWER:.0%} (never below {advice.FLOOR:.0%})")
    print("| True difference (margins) | Paired SD (margins) | Advised | Stated chance (mean) | Decided at the advised "
          "look | Reached - stated |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    every = []
    for effect, spread in truths:
        found = [r for r in (study(rng, effect, spread, start) for _ in range(trials)) if r is not None]
        every += found
        if not found:
            print(f"| {effect:.2f} | {spread:.2f} | 0 % | | | |")
            continue
        stated = statistics.fmean(s for s, _ in found)
        reached = statistics.fmean(float(d) for _, d in found)
        print(f"| {effect:.2f} | {spread:.2f} | {100 * len(found) / trials:.0f} % | {100 * stated:.1f} % | "
              f"{100 * reached:.1f} % | {100 * (reached - stated):+.1f} |", flush=True)
    print("\n| Chance stated | Studies advised | Stated (mean) | Decided at the advised look |")
    print("| --- | ---: | ---: | ---: |")
    for low in range(50, 100, 10):
        part = [(s, d) for s, d in every if low / 100 <= s < (low + 10) / 100 or (low == 90 and s == 1.0)]
        if part:
            print(f"| {low} to {low + 10} % | {len(part)} | {100 * statistics.fmean(s for s, _ in part):.1f} % | "
                  f"{100 * statistics.fmean(float(d) for _, d in part):.1f} % |")
    if every:
        print(f"| all | {len(every)} | {100 * statistics.fmean(s for s, _ in every):.1f} % | "
              f"{100 * statistics.fmean(float(d) for _, d in every):.1f} % |")
    print(f"{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
