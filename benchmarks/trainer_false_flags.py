"""How often the trainer check flags a correct candidate (grpo_equivalence.checks.trainer_verdict), under the error
model its floor measures: the candidate's kernels err independently of the reference's, as much as the reference's
own precision change does. A quantity of n numbers then differs by ||e_c - e_r|| / ||e_r|| times its floor, with
e_c and e_r independent standard normal vectors. Prints, per n: the chance FACTOR (3) flags it, alone and as one of
the loss stage's three scalars (the loss and its two terms), the factors that would hold 5 % a stage (the
quantiles at 1 - 5 % and 1 - 5 %/3), and the chance a scalar summing n such numbers is flagged against its floor
today (the larger of its own draw and the control's per-token differences summed with none cancelling,
trainer_verdict._kl_reach), where the errors of the n numbers share a part (correlation 0 and 0.9: a precision's
rounding is not independent token by token).

    python benchmarks/trainer_false_flags.py [DRAWS]   (default 400000)

With --runs SEEDS, real trainer checks instead, on the CPU with the tiny study: at each seed (its own batch, sampled
by `hf`, and its own adapter) the reference `hf`, its control in the other precision and each correct candidate
(the same trainer through another rollout backend), compared as the workflow compares them. Prints, per stage,
how many comparisons flagged it and the spread of its floor over the seeds (one draw each); and per fault of the
trainer (hf+no_kl, hf+loss_x2), at how many seeds it was named where it acts. Writes them as JSON.

    python benchmarks/trainer_false_flags.py --runs 10 [--dtype float32] [--first-seed 5031] [--out FILE]

On a GPU (--gpu), where candidates whose kernels differ from `hf`'s err apart from it (`hf+liger`: Liger's Triton
kernels and TRL's Liger loss), --jobs seeds at once:

    python benchmarks/trainer_false_flags.py --runs 10 --gpu --dtype bfloat16 --jobs 10 \
        --candidates hf_static native hf+liger native+liger
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402

from grpo_equivalence.checks import trainer_verdict  # noqa: E402
from grpo_equivalence.runtime import environment  # noqa: E402

CANDIDATES = ("hf_static", "cb_paged", "native")
# Faults of the trainer the check must still flag, at the quantity where each acts
FAULTS = {"hf+no_kl": "kl_term", "hf+loss_x2": "loss"}
OTHER = {"float32": "bfloat16", "bfloat16": "float32"}
# Seeds no trainer check of the docs used: 5001 to 5010 were read to change the rule of the loss's scale, 5011 to 5020
# (the H100's Liger flags) to give a scalar the per-token floor's reach, 5021 to 5030 under a first form of that reach,
# 5031 to 5050 (Liger's flags at vector stages on an H100) to set FACTOR to 3
FIRST_SEED = 5051


def ratios(numbers: int, draws: int, rng):
    import numpy as np

    candidate, reference = rng.standard_normal((draws, numbers)), rng.standard_normal((draws, numbers))
    return np.linalg.norm(candidate - reference, axis=1) / np.linalg.norm(reference, axis=1)


def reach_flags(numbers: int, draws: int, rng, correlation: float = 0.0):
    """How often a scalar summing `numbers` per-token values is flagged at FACTOR against the larger of its own draw
    and the control's per-token differences summed with none cancelling (w = 1), the errors of the tokens sharing
    `correlation` (a common part): the candidate's, the reference's and the control's each drawn alike."""
    import numpy as np

    def errors():
        shared = rng.standard_normal((draws, 1))
        return np.sqrt(correlation) * shared + np.sqrt(1 - correlation) * rng.standard_normal((draws, numbers))

    candidate, reference, control = errors(), errors(), errors()
    floor = np.maximum(np.abs((control - reference).sum(axis=1)), np.abs(control - reference).sum(axis=1))
    return float((np.abs((candidate - reference).sum(axis=1)) > trainer_verdict.FACTOR * floor).mean())


def seed_checks(seed: int, dtype: str, gpu: bool, candidates: tuple) -> list[dict]:
    """At one seed (its own batch, sampled by `hf`, and its own adapter): the trainer checks of the reference, its
    control, `candidates` and FAULTS, and each candidate's and fault's comparison. Candidates whose configuration
    patches transformers' modules (Liger's kernels patch them for the whole process) run last, so that no other check
    computes with them; the caller gives each seed a process of its own where any does."""
    import torch

    from grpo_equivalence.checks import trainer
    from grpo_equivalence.training import faults

    dataset = {"path": "json", "data_files": str(benchlib.DATA)}
    patching = [c for c in candidates if faults.grpo_settings(c, {}).get("use_liger_kernel")]
    order = [("reference", "hf", dtype), ("control", "hf", OTHER[dtype]),
             *[(c, c, dtype) for c in (*[c for c in candidates if c not in patching], *FAULTS, *patching)]]
    comparisons = []
    with tempfile.TemporaryDirectory() as tmp:
        config = benchlib.study(dtype=dtype, gpu=gpu)
        config["grpo"]["seed"] = seed
        folder = Path(tmp)
        batch = trainer.sample_batch(config, "hf", model_path=str(benchlib.MODEL), dataset=dataset,
                                     out=folder / "batch.json", log=benchlib.quiet)
        checks = {}
        for name, backend, precision in order:
            trainer.check({**config, "dtype": precision}, backend, model_path=str(benchlib.MODEL), dataset=dataset,
                          batch=batch, max_steps=12, out=folder / f"{name}.json", tensors=folder / f"{name}.pt",
                          log=benchlib.quiet)
            checks[name] = (json.loads((folder / f"{name}.json").read_text()), torch.load(folder / f"{name}.pt"))
        for name in (*candidates, *FAULTS):
            result = trainer_verdict.compare(checks["reference"], checks[name], checks["control"])
            comparisons.append({"seed": seed, "candidate": name, "first": result["first"],
                                "quantities": {q: {k: row[k] for k in ("difference", "floor", "differs")}
                                               for q, row in result["quantities"].items()}})
            print(f"seed {seed} {name}: first {result['first']}", flush=True)
    return comparisons


def real_runs(seeds: int, dtype: str, first_seed: int = FIRST_SEED, gpu: bool = False,
              candidates: tuple = CANDIDATES, jobs: int = 1) -> dict:
    """The trainer checks of the reference, its control, `candidates` and FAULTS at `seeds` seeds (seed_checks), up
    to `jobs` seeds at once, each in a process of its own where jobs > 1; per seed and candidate, every stage's
    difference, floor and whether it was flagged."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    benchlib.build_tiny(2)
    seed_list = range(first_seed, first_seed + seeds)
    if jobs > 1:  # spawned (CUDA cannot fork), one seed a process: Liger's patches die with it
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
            per_seed = list(pool.map(seed_checks, seed_list, *[[x] * seeds for x in (dtype, gpu, candidates)]))
    else:
        per_seed = [seed_checks(seed, dtype, gpu, candidates) for seed in seed_list]
    device = None
    if gpu:
        import torch

        device = torch.cuda.get_device_name(0)
    return {"dtype": dtype, "control_dtype": OTHER[dtype], "seeds": seeds, "first_seed": first_seed,
            "device": device or "cpu", "candidates": list(candidates), "faults": FAULTS,
            "factor": trainer_verdict.FACTOR, "comparisons": [c for seed in per_seed for c in seed],
            "environment": environment.describe()}


def runs_table(result: dict) -> str:
    """Per stage: the comparisons that flagged it, the largest difference over its threshold, and its floor's
    spread over the seeds (each seed's floor a draw of its own)."""
    import statistics

    lines = ["| Stage | Flagged | Largest difference / threshold | Floor over the seeds: median (min to max) |",
             "| --- | ---: | ---: | --- |"]
    every = [c for c in result["comparisons"] if c["candidate"] in result["candidates"]]
    for name in (*trainer_verdict.ORDER, *trainer_verdict.TERMS):
        rows = [c["quantities"][name] for c in every if c["quantities"][name]["difference"] is not None]
        if not rows:
            continue
        floors = sorted({c["seed"]: c["quantities"][name]["floor"] for c in every}.values())
        factor = result.get("factor", trainer_verdict.FACTOR)  # the rule the file's checks were judged by
        worst = max(r["difference"] / max(factor * r["floor"], trainer_verdict.MIN_DIFFERENCE) for r in rows)
        spread = (f"{statistics.median(floors):.3g} ({floors[0]:.3g} to {floors[-1]:.3g})"
                  if name not in trainer_verdict.EXACT else "exact")
        lines.append(f"| {trainer_verdict.NAMES[name]} | {sum(r['differs'] for r in rows)} of {len(rows)} | "
                     f"{worst:.3g} | {spread} |")
    return "\n".join(lines)


def faults_table(result: dict) -> str:
    """Per fault of the trainer: at how many seeds the check named the quantity where it acts as the first that
    differs, and what it named at the others."""
    from collections import Counter

    lines = ["| Fault | Named where it acts | Otherwise named |", "| --- | ---: | --- |"]
    for fault, where in result.get("faults", {}).items():
        named = Counter(c["first"] for c in result["comparisons"] if c["candidate"] == fault)
        others = ", ".join(f"{trainer_verdict.NAMES[k] if k else 'nothing'} {n}"
                           for k, n in sorted(named.items(), key=lambda item: str(item[0])) if k != where)
        lines.append(f"| `{fault}` ({trainer_verdict.NAMES[where]}) | {named[where]} of {sum(named.values())} | "
                     f"{others or '-'} |")
    return "\n".join(lines)


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("draws", nargs="?", type=int, default=400_000)
    parser.add_argument("--runs", type=int, help="real trainer checks at this many seeds, instead of the model")
    parser.add_argument("--dtype", choices=tuple(OTHER), default="float32")
    parser.add_argument("--first-seed", type=int, default=FIRST_SEED)
    parser.add_argument("--out", default="results/benchmarks/trainer-false-flags.json")
    parser.add_argument("--gpu", action="store_true", help="the checks on the GPU, where two stacks' kernels err apart")
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES),
                        help="correct candidates against hf (hf+liger: TRL's Liger kernels and loss, on a GPU)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds checked at once, each in a process of its own")
    args = parser.parse_args()
    if args.runs:
        result = real_runs(args.runs, args.dtype, args.first_seed, args.gpu, tuple(args.candidates), args.jobs)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(runs_table(result))
        print(faults_table(result))
        return
    draws = args.draws
    rng = np.random.default_rng(20261205)
    factor = trainer_verdict.FACTOR
    print(f"error model, {draws} draws a row")
    print(f"| numbers | flagged at factor {factor:g}, alone | the loss stage (3 such quantities) | factor for 5 % alone "
          "| factor for 5 % a loss stage | a scalar summing them, its floor today (correlation 0 / 0.9) |\n"
          "| ---: | ---: | ---: | ---: | ---: | ---: |")
    for numbers in (1, 2, 3, 5, 10, 20, 50, 100, 1000):
        r = ratios(numbers, draws, rng)
        stage = 1 - np.mean([(ratios(numbers, draws, rng) <= factor).mean() for _ in range(3)]) ** 3
        reach = " / ".join(f"{100 * reach_flags(numbers, min(draws, 100_000), rng, c):.1f} %" for c in (0.0, 0.9))
        print(f"| {numbers} | {100 * (r > factor).mean():.1f} % | {100 * stage:.1f} % | {np.quantile(r, 0.95):.2f} | "
              f"{np.quantile(r, 1 - 0.05 / 3):.2f} | {reach} |")


if __name__ == "__main__":
    main()
