"""How often the rollout check calls each injected fault divergent, and a reseeded reference divergent.

Each repetition is one report's rollout check on the tiny study (studies/tiny.yaml's settings): the reference
backend at one seed, and as candidates judged together (Holm over their tests) the reference at another seed
(the control) and the reference with each sampling fault (grpo_equivalence.training.faults), each at a seed of its own.
Prints, per candidate, the share of repetitions called divergent, equivalent and inconclusive, and writes the
counts as JSON.

    python benchmarks/fault_detection.py [--reps 20] [--jobs 2] [--backend hf] [--out fault_detection.json]

It builds the tiny study's primed model and data first if results/tiny/ lacks them (snakemake).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SAMPLING_FAULTS = ("temperature_up", "no_min_p", "no_top_k")
MODEL = ROOT / "results/tiny/primed"
DATA = ROOT / "results/tiny/data/train.jsonl"


def study() -> dict:
    import yaml

    from grpo_equivalence.study.config import rollout_check_settings

    config = yaml.safe_load((ROOT / "studies/tiny.yaml").read_text())
    config["rollout_check"] = rollout_check_settings(config.get("rollout_check"))
    return config


def _check(job: tuple) -> dict:
    """One rollout check in a process of its own (one thread): its file's content."""
    backend, seed, out = job
    import torch

    torch.set_num_threads(1)
    from grpo_equivalence.checks import rollout

    dataset = {"path": "json", "data_files": str(DATA), "name": None}
    return rollout.check(study(), backend, model_path=str(MODEL), dataset=dataset, out=Path(out), seed=seed,
                         log=lambda message: None)


def build_tiny(jobs: int) -> None:
    """The tiny study's primed model and data, built by the workflow where results/tiny/ lacks them."""
    if not (MODEL.exists() and DATA.exists()):
        subprocess.run([sys.executable, "-m", "snakemake", str(MODEL.relative_to(ROOT)), str(DATA.relative_to(ROOT)),
                        "--cores", str(jobs), "--config", "study=studies/tiny.yaml"], cwd=ROOT, check=True)


def arguments(description: str, reps: int, out: str) -> argparse.ArgumentParser:
    """The options both fault benchmarks take."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--backend", default="hf")
    parser.add_argument("--out", default=out)
    return parser


def print_table(columns: tuple, what: str, names, counts: dict, divergent_by: dict, args) -> None:
    """Per candidate, the share of repetitions of each verdict and how often each test (metric) was divergent."""
    from grpo_equivalence.analysis import verdict

    print(f"| Candidate | {' | '.join(columns)} | Divergent by {what} ({', '.join(names)}) |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, found in counts.items():
        share = {k: 100 * v / args.reps for k, v in found.items()}
        label = "reseeded reference (control)" if name == "control" else f"{args.backend}+{name}"
        print(f"| {label} | {share[verdict.DIVERGENT]:.0f} % | {share[verdict.EQUIVALENT]:.0f} % | "
              f"{share[verdict.INCONCLUSIVE]:.0f} % | {', '.join(str(divergent_by[name][t]) for t in names)} |")


def prepare(args) -> None:
    """Offline, and the tiny study's model and data built."""
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    build_tiny(args.jobs)


def main() -> None:
    args = arguments(__doc__.splitlines()[0], 20, "fault_detection.json").parse_args()
    prepare(args)
    from grpo_equivalence.analysis import verdict
    from grpo_equivalence.checks import rollout_verdict

    config = study()
    scratch = ROOT / "results/benchmarks/fault_detection"
    candidates = ["control", *SAMPLING_FAULTS]
    jobs = []
    for rep in range(args.reps):
        base = 10_000 + 100 * rep  # seeds apart from the study's, one per check
        jobs.append((args.backend, base, scratch / f"{rep}_reference.json"))
        jobs.append((args.backend, base + 1, scratch / f"{rep}_control.json"))
        jobs += [(f"{args.backend}+{fault}", base + 2 + i, scratch / f"{rep}_{fault}.json")
                 for i, fault in enumerate(SAMPLING_FAULTS)]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        files = list(pool.map(_check, jobs))
    counts = {c: dict.fromkeys((verdict.DIVERGENT, verdict.EQUIVALENT, verdict.INCONCLUSIVE), 0) for c in candidates}
    by_test = {c: {t: 0 for t in rollout_verdict.TESTS} for c in candidates}
    width = 2 + len(SAMPLING_FAULTS)
    check = config["rollout_check"]
    for rep in range(args.reps):
        reference, *others = files[rep * width:(rep + 1) * width]
        comparisons = [rollout_verdict.compare(reference, other, alpha=config["verdict"]["alpha"],
                                               support_margin=check["support_margin"], margin_sd=check["margin"])
                       for other in others]
        rollout_verdict.finalize(comparisons, config["verdict"]["alpha"])
        for name, comparison in zip(candidates, comparisons, strict=True):
            counts[name][comparison["verdict"]] += 1
            for test in rollout_verdict.TESTS:
                by_test[name][test] += comparison["tests"][test]["verdict"] == verdict.DIVERGENT
    tokens = sum(c["tokens"] for f in files for c in f["completions"]) / len(files)
    print(f"rollout check, tiny study, {args.backend}: {args.reps} repetitions, {config['rollout_check']['prompts']} "
          f"prompts, {tokens:.0f} tokens per check, {time.perf_counter() - start:.0f} s")
    print_table(("Divergent", "Equivalent", "Inconclusive"), "test", rollout_verdict.TESTS, counts, by_test, args)
    Path(args.out).write_text(json.dumps({"reps": args.reps, "backend": args.backend, "tokens_per_check": tokens,
                                          "counts": counts, "divergent_by_test": by_test}, indent=1) + "\n")


if __name__ == "__main__":
    main()
