"""The statistics recorder's own cost: steps with the full recorder against steps with step timestamps only.

    python benchmarks/callback_overhead.py [--method alternate|pairs] [--study studies/tiny.yaml] [--backend hf]
                                           [--steps 30] [--runs 3] [--gpus 1] [--out overhead.json]

Each run is the workflow's train job for one backend and step count (snakemake, one scratch folder).
--method alternate (default): each run has `recorder: alternate`, the full recorder's work (synchronisation,
memory readings) on odd steps and none on even ones, every step timed from the previous step's end; a run's
ratio is the median odd step over the median even step (after `median_skip_steps`). Both halves share one
run, so the ratio is free of the run-to-run noise that two runs carry.
--method pairs: runs with `recorder: full` and `recorder: timestamps` in alternating order, a pair's ratio
being the ratio of their median steps.
Between runs the statistics file and the run cache are removed, so that every run trains. Prints each ratio
and their median: the recorder's overhead is ratio - 1. With --gpus 1 the study trains on a GPU in bfloat16;
the tiny model is the hardest case, since its steps are the shortest.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from grpo_equivalence.analysis import stats  # noqa: E402
from grpo_equivalence.analysis.summary import summarise  # noqa: E402
from grpo_equivalence.runtime import paths  # noqa: E402

MODES = ("full", "timestamps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default=str(ROOT / "studies" / "tiny.yaml"))
    parser.add_argument("--backend", default="hf")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--method", choices=("alternate", "pairs"), default="alternate")
    parser.add_argument("--runs", type=int, default=3, help="runs (alternate) or pairs of runs (pairs)")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per train job (0: the CPU)")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    config = yaml.safe_load(Path(args.study).read_text())
    config.update(backends=[args.backend], reference=args.backend, steps=[args.steps], gpus_per_train_job=args.gpus,
                  replicates={"reference": 1, "others": 1})
    if args.gpus:
        config.update(dtype="bfloat16", train_threads=4)
    skip = config.get("median_skip_steps", 3)
    ratios = []
    with tempfile.TemporaryDirectory(prefix="callback_overhead_") as work:
        work = Path(work)
        (work / "study.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        target = paths.STATS.format(backend=args.backend, steps=args.steps)

        def train(mode: str) -> dict:
            (work / target).unlink(missing_ok=True)
            shutil.rmtree(work / paths.RUN_CACHE, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(work),
                            target, "--cores", "8", "--resources", f"gpu={max(args.gpus, 1)}", "-q",
                            "--config", f"study={work / 'study.yaml'}", f"recorder={mode}", "results=results"], check=True)
            return stats.load(work / target)

        for i in range(args.runs):
            if args.method == "alternate":
                timed = [s for s in train("alternate")["steps"] if s["step"] > skip]
                # The full recorder's steps are the ones with a memory reading
                medians = {"full": statistics.median(s["wall_s"] for s in timed if s["peak_mem_gb"] is not None),
                           "timestamps": statistics.median(s["wall_s"] for s in timed if s["peak_mem_gb"] is None)}
            else:
                medians = {mode: summarise(train(mode), skip)["median_step_s"]
                           for mode in (MODES if i % 2 == 0 else reversed(MODES))}
            ratio = medians["full"] / medians["timestamps"]
            ratios.append({**medians, "ratio": ratio})
            print(f"run {i + 1} ({args.method}): median step full {medians['full'] * 1000:.2f} ms, timestamps only "
                  f"{medians['timestamps'] * 1000:.2f} ms, ratio {ratio:.4f}", flush=True)
    median_ratio = statistics.median(r["ratio"] for r in ratios)
    print(f"median ratio of {len(ratios)}: {median_ratio:.4f} (recorder overhead {100 * (median_ratio - 1):+.2f} %)")
    if args.out:
        Path(args.out).write_text(json.dumps({"method": args.method, "backend": args.backend, "steps": args.steps,
                                              "gpus": args.gpus, "median_over_steps_after": skip, "runs": ratios,
                                              "median_ratio": median_ratio}, indent=1) + "\n")


if __name__ == "__main__":
    main()
