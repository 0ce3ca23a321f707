"""The training verdict's boundaries at its planned looks (grpo_equivalence.analysis.sequential.simulate_boundaries),
simulated once and kept in src/grpo_equivalence/analysis/boundaries.json, which the verdict reads: the critical |t|
of the paired t-test at each look for levels from sequential.SIMULATED_FROM to 1 (a grid in log(level) the verdict
interpolates on). Rerun after changing sequential.LOOKS.

    python benchmarks/verdict_boundaries.py [PATHS]   (default 20,000,000: about 2 minutes and 1.5 GB)
"""

import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from grpo_equivalence.analysis import sequential  # noqa: E402

SEED = 35
POINTS = 64


def main() -> None:
    paths = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000_000
    low = math.log(sequential.SIMULATED_FROM)
    levels = [math.exp(low + (0 - low) * i / (POINTS - 1)) for i in range(POINTS)]
    start = time.perf_counter()
    critical = sequential.simulate_boundaries(levels, paths, SEED)
    table = {"looks": list(sequential.LOOKS), "paths": paths, "seed": SEED,
             "command": f"python benchmarks/verdict_boundaries.py {paths}", "levels": levels, **critical}
    sequential.BOUNDARIES.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{len(levels)} levels, {paths} paths, {time.perf_counter() - start:.0f} s -> {sequential.BOUNDARIES}")
    for level in (0.05, 0.1):
        sequential._table.cache_clear()
        print(f"level {level}: critical |t| {[round(c, 4) for c in sequential.boundaries.__wrapped__(level)]}, "
              f"one-sided -t {[round(c, 4) for c in sequential.boundaries.__wrapped__(level, sides=1)]}")


if __name__ == "__main__":
    main()
