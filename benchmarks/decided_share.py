"""How much a packed study of n paired seeds would decide, estimated from real runs: n seeds drawn (without
replacement) from the seeds that every backend ran in the given studies' statistics folders, judged as the report
judges them, the share of the candidate x metric cells for kl, reward and completion length decided (equivalent
or divergent). An estimate from the pooled runs (the draws share their seeds), not a verdict: it says what a
study of that many seeds may expect at the spread those runs had.

    python benchmarks/decided_share.py STATS_DIR [STATS_DIR ...] [--seeds 8 12] [--draws 200] [--reference vllm]
"""

import argparse
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchlib import DECIDED, headline_cells  # noqa: E402

from grpo_equivalence.analysis import stats  # noqa: E402
from grpo_equivalence.report import render  # noqa: E402


def decided(pool: dict, seeds: list[int], reference: str) -> dict:
    """{(candidate, metric): decided or not} of a study made of `pool`'s runs at `seeds` (the first the study's
    seed)."""
    runs = {f"grpo_{backend}_{steps}{'' if i == 0 else f'_seed{seed}'}.json": pool[(backend, steps, seed)]
            for i, seed in enumerate(seeds) for backend, steps, s in pool if s == seed}
    return {(candidate, metric): v["verdict"] in DECIDED for candidate, metric, _, v in headline_cells(runs, reference)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--seeds", nargs="+", type=int, default=[8, 12])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--reference", default="vllm")
    args = parser.parse_args(argv)
    pool = {}
    for folder in args.folders:
        for path in render.stats_files(folder):
            run = stats.load(path)
            pool[(run["backend"], run["max_steps"], run["seed"])] = run
    backends = {(b, n) for b, n, _ in pool}
    complete = sorted(s for s in {s for *_, s in pool} if all((b, n, s) in pool for b, n in backends))
    print(f"{len(complete)} seeds that every backend ran ({complete[0]} to {complete[-1]}), {len(backends)} backends")
    rng, result = random.Random(0), {}
    for n in args.seeds:
        shares, cells = [], {}
        for _ in range(args.draws):
            found = decided(pool, rng.sample(complete, n), args.reference)
            shares.append(sum(found.values()) / len(found))
            for cell, done in found.items():
                cells.setdefault(cell, []).append(done)
        result[n] = {"mean_share": statistics.fmean(shares), "share_at_least_80": sum(s >= 0.8 for s in shares) / len(shares),
                     "cells": {f"{c} {m}": statistics.fmean(v) for (c, m), v in sorted(cells.items())}}
        print(f"{n} seeds: {100 * result[n]['mean_share']:.0f} % of the cells decided on average, 80 % or more in "
              f"{100 * result[n]['share_at_least_80']:.0f} % of {args.draws} draws; open most often: "
              + ", ".join(f"{c} ({100 * (1 - p):.0f} %)" for c, p in sorted(result[n]["cells"].items(), key=lambda x: x[1])[:4]))
    return result


if __name__ == "__main__":
    main()
