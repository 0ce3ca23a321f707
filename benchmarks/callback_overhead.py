"""The statistics recorder's own cost: the same train job with the full recorder and with step timestamps only.

    python benchmarks/callback_overhead.py [--study studies/tiny.yaml] [--backend hf] [--steps 30] [--pairs 3]
                                           [--gpus 1] [--out overhead.json]

Each run is the workflow's train job for one backend and step count (snakemake, one scratch folder), once with
`recorder: full` (what every study records: synchronised step bounds, memory, TRL's block timings) and once
with `recorder: timestamps` (the time between step ends, nothing else), in alternating order. Between runs the
statistics file and the run cache are removed, so that every run trains. Prints each pair's median steps
(after `median_skip_steps`) and their ratio, then the median ratio: the recorder's overhead is ratio - 1.
With --gpus 1 the study trains on a GPU in bfloat16; the tiny model is the hardest case, since its steps are
the shortest.
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
from grpo_equivalence import paths, stats  # noqa: E402
from grpo_equivalence.summary import summarise  # noqa: E402

MODES = ("full", "timestamps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default=str(ROOT / "studies" / "tiny.yaml"))
    parser.add_argument("--backend", default="hf")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--gpus", type=int, default=0, help="GPUs per train job (0: the CPU)")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    config = yaml.safe_load(Path(args.study).read_text())
    config.update(backends=[args.backend], reference=args.backend, steps=[args.steps], gpus_per_train_job=args.gpus,
                  replicates={"reference": 1, "others": 1})
    if args.gpus:
        config.update(dtype="bfloat16", train_threads=4)
    skip = config.get("median_skip_steps", 3)
    pairs = []
    with tempfile.TemporaryDirectory(prefix="callback_overhead_") as work:
        work = Path(work)
        (work / "study.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        target = paths.STATS.format(backend=args.backend, steps=args.steps)
        for pair in range(args.pairs):
            medians = {}
            for mode in MODES if pair % 2 == 0 else reversed(MODES):
                (work / target).unlink(missing_ok=True)
                shutil.rmtree(work / paths.RUN_CACHE, ignore_errors=True)
                subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(work),
                                target, "--cores", "8", "--resources", f"gpu={max(args.gpus, 1)}", "-q",
                                "--config", f"study={work / 'study.yaml'}", f"recorder={mode}"], check=True)
                medians[mode] = summarise(stats.load(work / target), skip)["median_step_s"]
            ratio = medians["full"] / medians["timestamps"]
            pairs.append({**medians, "ratio": ratio})
            print(f"pair {pair + 1}: median step full {medians['full'] * 1000:.2f} ms, timestamps only "
                  f"{medians['timestamps'] * 1000:.2f} ms, ratio {ratio:.4f}", flush=True)
    median_ratio = statistics.median(p["ratio"] for p in pairs)
    print(f"median ratio of {len(pairs)} pairs: {median_ratio:.4f} (recorder overhead {100 * (median_ratio - 1):+.2f} %)")
    if args.out:
        Path(args.out).write_text(json.dumps({"backend": args.backend, "steps": args.steps, "gpus": args.gpus,
                                              "median_over_steps_after": skip, "pairs": pairs,
                                              "median_ratio": median_ratio}, indent=1) + "\n")


if __name__ == "__main__":
    main()
