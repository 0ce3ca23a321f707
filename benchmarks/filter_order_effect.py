"""What the filters' order does to the rollout check: at the tiny model's own logits, the exact expected score and
clearly-outside rate of samplers applying the study's settings in vLLM's order (min_p, then top_k and top_p) and in
transformers' (top_k, top_p, then min_p), at the settings' temperature and at each temperature fault's, scored
against transformers' order as a study checks by default. No sampling noise: every figure is an expectation over
each position's distribution, averaged over the positions of completions `hf` sampled (float32, the CPU).

    python benchmarks/filter_order_effect.py [--sampling tiny|study] [--prompts 100] [--out OUT.json]

Per sampler: the mean score log q(x) + H(q) over the tokens q keeps (0 for a sampler that is q), and the share of
its draws q excludes. A fault's effect as the check sees it is its sampler's figure minus the correct sampler's of
the same order: for transformers' order what the check predicts, for vLLM's what a vLLM backend's fault shows
against a scorer of transformers' order.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import against_q, sampled_logits  # noqa: E402


def expectations(logits, settings: dict, sampler: dict, order: str) -> dict:
    """Per position of `logits`, the sampler's expected score under q (transformers' order of `settings`) and its
    mass outside q's support."""
    import torch

    from grpo_equivalence.checks import scoring

    ids = torch.zeros((len(logits), 1), dtype=torch.long)
    return against_q(logits, settings, scoring.processors(sampler, order)(ids, logits.clone()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sampling", choices=("tiny", "study"), default="tiny")
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from grpo_equivalence.training import faults

    settings, logits = sampled_logits(args.sampling, args.prompts)
    rows = {}
    for name in ("correct", "temperature_up", "temperature_down"):
        sampler = settings if name == "correct" else faults.sampler_settings(name, settings)
        rows[name] = {order: expectations(logits, settings, sampler, order) for order in ("transformers", "vllm")}
    effects = {name: {order: {key: rows[name][order][key] - rows["correct"][order][key] for key in ("score", "outside")}
                      for order in ("transformers", "vllm")} for name in ("temperature_up", "temperature_down")}
    result = {"sampling": settings, "positions": len(logits), "expected": rows, "fault_effects": effects}
    print(f"{len(logits)} positions, {args.sampling} sampling {settings}")
    print("| sampler | order | mean score under q | outside q per token |\n| --- | --- | ---: | ---: |")
    for name, by_order in rows.items():
        for order, values in by_order.items():
            print(f"| {name} | {order} | {values['score']:+.5f} | {values['outside']:.5f} |")
    for name, by_order in effects.items():
        print(f"{name}: effect on the score, transformers' order {by_order['transformers']['score']:+.5f}, vLLM's "
              f"{by_order['vllm']['score']:+.5f}; on the outside rate {by_order['transformers']['outside']:+.5f}, "
              f"{by_order['vllm']['outside']:+.5f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
