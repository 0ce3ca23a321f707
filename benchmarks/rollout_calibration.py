"""The rollout check on synthetic samplers whose answer is known (grpo_equivalence.checks.synthetic): for each
precision, how often a reseeded correct sampler (the control) and samplers at the margin's edges (temperature x0.9
and x1.1, the faults temperature_down and temperature_up, with the score margin at 10 %) are called divergent and
equivalent, and how often the score test alone calls them equivalent. At the margin's edge the two one-sided tests
call a sampler equivalent at most alpha (5 %) of the time, whatever the number of tokens: the rate measured here says
whether the rounding of bfloat16 moves the score test there (float32 beside it, with the same logits' shape).

    python benchmarks/rollout_calibration.py [REPS] [TOKENS] [OUT.json]   (defaults 200, 10000: tokens a side)

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


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    with Pool(2) as pool:
        rows = pool.starmap(run, [(case, reps, tokens) for case in CASES])
    result = {"settings": synthetic.TINY, "margin": MARGIN, "scale": SCALE, "alpha": 0.05, "rows": rows}
    print("| dtype | sampler | divergent | equivalent | score test equivalent |\n| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['dtype']} | {r['sampler']} | {r['divergent']}/{r['reps']} | {r['equivalent']}/{r['reps']} | "
              f"{r['score_equivalent']}/{r['reps']} |")
    if len(sys.argv) > 3:
        Path(sys.argv[3]).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
