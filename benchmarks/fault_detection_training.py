"""How often the training verdict, at the tiny study's run counts, calls each injected fault divergent, and a
reseeded reference divergent.

Each repetition is one report of the tiny study at its longest step count (studies/tiny.yaml: replicates.reference
runs of the reference, as many of each candidate): the reference with seeds s, s+1, ...; every fault of
grpo_equivalence.training.faults on the reference backend with the same seeds (paired, as a study runs them); and the
control, the reference again with seeds of its own (compared unpaired). Each is judged as the report judges it
(compare: Holm over the metrics of its comparison, weighted towards the headline metrics).
Prints, per candidate, the share of repetitions with a metric called divergent, and writes the counts as JSON.

    python benchmarks/fault_detection_training.py [--reps 8] [--jobs 14] [--out FILE] [--steps N] [--runs N]

It builds the tiny study's primed model and data first if results/tiny/ lacks them (snakemake).
"""

import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchlib import DATA, MODEL, arguments, prepare, print_table, study  # noqa: E402


def _train(job: tuple) -> str:
    """One training run in a process of its own (one thread): the statistics file's path."""
    backend, seed, steps, out, gpus = job
    import torch

    torch.set_num_threads(1)
    from grpo_equivalence.training import train

    config = study()
    config["grpo"] = {**config["grpo"], "seed": seed}
    config["gpus_per_train_job"] = gpus
    dataset = {"path": "json", "data_files": str(DATA), "name": None}
    train.run(config, backend, steps, model_path=str(MODEL), dataset=dataset, out=Path(out), log=lambda m: None)
    return str(out)


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], 8, "fault_detection_training.json")
    parser.add_argument("--steps", type=int, help="steps per run (default: the tiny study's longest)")
    parser.add_argument("--runs", type=int, help="runs per candidate (default: the tiny study's replicates.reference)")
    args = parser.parse_args()
    prepare(args)
    from grpo_equivalence.analysis import stats, verdict
    from grpo_equivalence.analysis.compare import compare
    from grpo_equivalence.training import faults

    config = study()
    steps, runs = args.steps or max(config["steps"]), args.runs or config["replicates"]["reference"]
    candidates = ["control", *faults.FAULTS]
    scratch = ROOT / "results/benchmarks/fault_detection_training"
    jobs = []
    for rep in range(args.reps):
        base = 20_000 + 100 * rep
        for name in ["reference", *candidates]:
            backend = args.backend if name in ("reference", "control") else f"{args.backend}+{name}"
            first = base + runs if name == "control" else base  # the control's seeds are its own
            jobs += [(backend, first + i, steps, scratch / f"{rep}_{name}_{i}.json", int(args.gpu)) for i in range(runs)]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        paths = list(pool.map(_train, jobs))
    counts = {c: dict.fromkeys((verdict.DIVERGENT, verdict.EQUIVALENT, verdict.INCONCLUSIVE), 0) for c in candidates}
    metrics_divergent = {c: dict.fromkeys(verdict.METRICS, 0) for c in candidates}
    per_rep = (1 + len(candidates)) * runs
    for rep in range(args.reps):
        loaded = [stats.load(p) for p in paths[rep * per_rep:(rep + 1) * per_rep]]
        reference, *groups = [loaded[i:i + runs] for i in range(0, per_rep, runs)]
        comparisons = [compare(reference, group, alpha=config["verdict"]["alpha"], margin=config["verdict"]["margin"])
                       for group in groups]
        for name, comparison in zip(candidates, comparisons, strict=True):
            found = [comparison["metrics"][m]["verdict"]["verdict"] for m in verdict.METRICS]
            judged = [v for v in found if v != verdict.NOT_LOGGED]
            overall = (verdict.DIVERGENT if verdict.DIVERGENT in judged else
                       verdict.EQUIVALENT if judged and set(judged) == {verdict.EQUIVALENT} else verdict.INCONCLUSIVE)
            counts[name][overall] += 1
            for metric, v in zip(verdict.METRICS, found, strict=True):
                metrics_divergent[name][metric] += v == verdict.DIVERGENT
    print(f"training verdict, tiny study, {args.backend}: {args.reps} repetitions of {runs} runs per candidate at "
          f"{steps} steps, {time.perf_counter() - start:.0f} s")
    print_table(("A metric divergent", "All equivalent", "Otherwise"), "metric", verdict.METRICS, counts,
                metrics_divergent, args)
    Path(args.out).write_text(json.dumps({"reps": args.reps, "runs": runs, "steps": steps, "counts": counts,
                                          "divergent_by_metric": metrics_divergent}, indent=1) + "\n")


if __name__ == "__main__":
    main()
