"""The rollout check on synthetic samplers whose answer is known (grpo_equivalence.checks.synthetic): for each
precision, how often a reseeded correct sampler (the control) and samplers at the margin's edges (temperature x0.9
and x1.1, the faults temperature_down and temperature_up, with the score margin at 10 %) are called divergent and
equivalent, and how often the score test alone calls them equivalent. At the margin's edge the two one-sided tests
call a sampler equivalent at most alpha (5 %) of the time, whatever the number of tokens: the rate measured here says
whether the rounding of bfloat16 moves the score test there (float32 beside it, with the same logits' shape).

    python benchmarks/rollout_calibration.py [REPS] [TOKENS] [OUT.json]   (defaults 200, 10000: tokens a side)

With --own, the sampler judged on its own logits as a backend that reports them is (one-sample tests, no
reference), at config.yaml's sampling (temperature 0.1, min_p 0.5: a few leading logits within hundredths of each
other near 5, where bfloat16 keeps steps of 1/32): per case the score test's verdicts, and the mean and spread of
its z against the margin's edge (0 and 1 where the test holds its rate there), in bfloat16.

    python benchmarks/rollout_calibration.py --own 1000 5000 OUT.json

Cases run two at a time (two processes); each prints its progress.
"""

import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from grpo_equivalence.checks import rollout_verdict, synthetic  # noqa: E402

SCALE = 2.0  # the logits' spread (synthetic.logits)
MARGIN = 0.1  # the score test's temperature margin: the schema's default
CASES = [(dtype, sampler) for dtype in ("float32", "bfloat16") for sampler in
         ("control", "temperature_down", "temperature_up")]


def run(case: tuple, reps: int, tokens: int) -> dict:
    import torch

    dtype, sampler = case
    generator = torch.Generator().manual_seed(1000 + CASES.index(case))
    counts, score_equivalent, began = {"divergent": 0, "equivalent": 0, "inconclusive": 0}, 0, time.time()
    settings = synthetic.TINY
    for rep in range(reps):
        reference = synthetic.check(synthetic.logits(tokens, SCALE, generator), settings, dtype, generator,
                                    margin=MARGIN)
        candidate_settings = settings if sampler == "control" else synthetic.faulty(sampler, settings)
        candidate = synthetic.check(synthetic.logits(tokens, SCALE, generator), candidate_settings, dtype, generator,
                                    margin=MARGIN)
        comparison = rollout_verdict.compare(reference, candidate, alpha=0.05, support_margin=0.001, margin_sd=0.1)
        rollout_verdict.finalize([comparison], 0.05)
        counts[comparison["verdict"]] += 1
        score_equivalent += comparison["tests"]["score"]["equivalent"]
        if (rep + 1) % 50 == 0:
            print(f"{dtype} {sampler}: {rep + 1} reps {counts}, score equivalent {score_equivalent}", flush=True)
    return {"dtype": dtype, "sampler": sampler, "reps": reps, "tokens": tokens, **counts,
            "score_equivalent": score_equivalent, "seconds": round(time.time() - began)}


# --own: config.yaml's sampling, with logits shaped as tests/test_exact.py's T0.1 (spread, offset)
OWN_SHAPE = (0.05, 5.0)


def run_own(case: tuple, reps: int, tokens: int) -> dict:
    """The score test on the sampler's own logits at config.yaml's sampling: its verdicts, and its z against the
    edge the case stands at (the hot margin for temperature_up, the cold for temperature_down, 0 for the control),
    each in the standard error the test uses there."""
    import math
    import statistics

    import torch

    from grpo_equivalence.checks import own_verdict

    torch.set_num_threads(1)  # two cases at a time on small tensors: more threads only wait on each other
    dtype, sampler = case
    generator = torch.Generator().manual_seed(2000 + CASES.index(case))
    counts, edge, began = {"divergent": 0, "equivalent": 0, "inconclusive": 0}, [], time.time()
    settings = synthetic.STUDY
    for rep in range(reps):
        truth = synthetic.logits(tokens, OWN_SHAPE[0], generator) + OWN_SHAPE[1]
        run_settings = settings if sampler == "control" else synthetic.faulty(sampler, settings)
        own = own_verdict.own_totals(synthetic.check(truth, run_settings, dtype, generator, margin=MARGIN, own=True))
        test = own_verdict.own_score_test(own, alpha=0.05)
        verdict = "divergent" if test["p_value"] < 0.05 else "equivalent" if test["equivalent"] else "inconclusive"
        counts[verdict] += 1
        side = {"temperature_up": ("hot", 0), "temperature_down": ("cold", 1)}.get(sampler)
        if side is None:
            edge.append(test["z"])
        else:
            edge.append((test["difference"] - test["margins"][side[1]]) * own["scored"]
                        / math.sqrt(own[f"{side[0]}_variance"]))
    return {"dtype": dtype, "sampler": sampler, "reps": reps, "tokens": tokens, **counts,
            "score_equivalent": counts["equivalent"], "edge_z_mean": statistics.fmean(edge),
            "edge_z_sd": statistics.stdev(edge), "seconds": round(time.time() - began)}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reps", nargs="?", type=int, default=200)
    parser.add_argument("tokens", nargs="?", type=int, default=10_000)
    parser.add_argument("out", nargs="?")
    parser.add_argument("--own", action="store_true", help="the sampler on its own logits, at config.yaml's sampling")
    args = parser.parse_args()
    with Pool(2) as pool:
        # on its own logits the sampler's precision is the question's: bfloat16, where rounding made ties
        cases = [case for case in CASES if case[0] == "bfloat16"] if args.own else CASES
        rows = pool.starmap(run_own if args.own else run, [(case, args.reps, args.tokens) for case in cases])
    result = {"settings": synthetic.STUDY if args.own else synthetic.TINY, "own": args.own, "margin": MARGIN,
              "scale": OWN_SHAPE if args.own else SCALE, "alpha": 0.05, "rows": rows}
    if args.own:
        print("| dtype | sampler | divergent | equivalent | z at the margin's edge: mean, SD |\n"
              "| --- | --- | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['dtype']} | {r['sampler']} | {r['divergent']}/{r['reps']} | {r['equivalent']}/{r['reps']} | "
                  f"{r['edge_z_mean']:.3f}, {r['edge_z_sd']:.3f} |")
    else:
        print("| dtype | sampler | divergent | equivalent | score test equivalent |\n| --- | --- | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['dtype']} | {r['sampler']} | {r['divergent']}/{r['reps']} | {r['equivalent']}/{r['reps']} | "
                  f"{r['score_equivalent']}/{r['reps']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
