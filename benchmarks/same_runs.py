"""Whether two sets of runs of the same study trained the same: for every run in both (backend, steps, seed), its
per-step training numbers compared value for value (every logged metric but timings and memory).

    python benchmarks/same_runs.py STATS_A STATS_B

Packing, the order of runs and warm or cold caches must change no run's numbers: two studies of the same
settings and code on the same machine should agree on every shared run.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from grpo_equivalence.analysis import runs as run_files
from grpo_equivalence.report import render  # noqa: E402

# What a step trained: its loss, gradient, reward and KL, and every metric TRL logged but its own timing
TRAINED = ("step", "loss", "grad_norm", "reward", "kl")
TIMING = ("step_time",)


def training_numbers(run: dict) -> list[dict]:
    return [{**{k: step.get(k) for k in TRAINED},
             **{k: v for k, v in (step.get("metrics") or {}).items() if k not in TIMING}} for step in run["steps"]]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    key = lambda r: (r["backend"], r["max_steps"], r["seed"])  # noqa: E731
    a = {key(r): r for r in run_files.load_runs(render.stats_files(args.a)).values()}
    b = {key(r): r for r in run_files.load_runs(render.stats_files(args.b)).values()}
    shared = sorted(set(a) & set(b))
    differ = [f"{k[0]} x {k[1]} seed {k[2]}" for k in shared if training_numbers(a[k]) != training_numbers(b[k])]
    result = {"shared_runs": len(shared), "identical": len(shared) - len(differ), "differ": differ,
              "metrics_compared": sorted({m for k in shared for step in training_numbers(a[k]) for m in step})}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
