"""vLLM's own top-k/top-p kernel at the tiny model's logits: does it keep what the sampling settings keep?

vLLM 0.26 samples a step of 8 rows or more on a GPU through a Triton kernel for top-k and top-p
(vllm/v1/sample/ops/topk_topp_triton.py), after its temperature and its min_p processor. This runs that kernel on
the logits of completions `hf` sampled from the tiny model (float32, the CPU), after vLLM's temperature and min_p
exactly as its sampler applies them, beside the exact filters (transformers' warpers in vLLM's order), for a
correct sampler and each temperature fault. Per sampler: the share of positions where the kernel keeps another set
of tokens than the exact filters, the share where it keeps only the top token where they keep several, and, as
filter_order_effect.py measures them, its expected score under q and its mass outside q's support.

    python benchmarks/vllm_nucleus.py [--sampling tiny|study] [--prompts 100] [--kernel installed|PATH] [--top-p P]
        [--out OUT.json]

--top-p P: the settings with this top_p instead of the study's (1.0: what a study without top_p would get).

--kernel installed: vLLM's own dispatcher (vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p) on the GPU,
as the engine calls it. --kernel PATH (a vLLM wheel, or its topk_topp_triton.py): the kernel's source run by
Triton's interpreter on the CPU (triton importable: `pip install --target DIR triton`, then
PYTHONPATH=DIR), with the tile sizes it takes on a GPU; its three imports
of vLLM's helpers are replaced by their plain equivalents (132 programs: an H200's multiprocessors).
"""

import argparse
import json
import os
import sys
import types
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

KERNEL_FILE = "vllm/v1/sample/ops/topk_topp_triton.py"
# What the kernel's source needs changed to run outside vLLM, in Triton's interpreter, with the GPU's tiles
INTERPRETED = {
    "from vllm.triton_utils import tl, triton": "import triton\nimport triton.language as tl",
    "from vllm.utils.math_utils import next_power_of_2":
        "def next_power_of_2(n):\n    return 1 << (n - 1).bit_length()",
    "from vllm.utils.platform_utils import num_compute_units": "def num_compute_units(index=None):\n    return 132",
    # the interpreter's loop index is a Python int
    "row_id.to(tl.int64) * LOGITS_STRIDE_0": "row_id * LOGITS_STRIDE_0",
    'if logits.device.type == "cpu":': "if False:  # the GPU's tile sizes",
}


def kernel(source: str):
    """vLLM's top-k/top-p function, (logits, k, p) -> logits with the dropped tokens at -inf, and vLLM's version
    (None where a lone file does not say)."""
    if source == "installed":
        import vllm
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

        return apply_top_k_top_p, vllm.__version__
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported
    path, version = Path(source), None
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            text = wheel.read(KERNEL_FILE).decode()
            metadata = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
            version = next((line.split(":", 1)[1].strip() for line in wheel.read(metadata[0]).decode().splitlines()
                            if line.startswith("Version:")), None) if metadata else None
    else:
        text = path.read_text()
    for old, new in INTERPRETED.items():
        if old not in text:
            raise SystemExit(f"{source}: the kernel's source no longer has {old!r}; this script reads vLLM 0.26's")
        text = text.replace(old, new)
    module = types.ModuleType("topk_topp_triton")
    exec(compile(text, KERNEL_FILE, "exec"), module.__dict__)
    return module.apply_top_k_top_p_triton, version


def vllm_sampler(logits, sampler: dict, top_k_top_p, device: str):
    """The logits vLLM's sampler draws from (forward_native, processed): float32, divided by the temperature, min_p
    as its MinPLogitsProcessor applies it, then top-k and top-p by `top_k_top_p`."""
    import torch

    values = logits.to(device=device, dtype=torch.float32) / (sampler.get("temperature") or 1.0)
    if sampler.get("min_p"):
        probabilities = values.softmax(-1)
        values = values.masked_fill(probabilities < probabilities.amax(-1, keepdim=True) * sampler["min_p"],
                                    -float("inf"))
    rows = len(values)
    k = torch.full((rows,), sampler["top_k"], dtype=torch.int32, device=device) if sampler.get("top_k") else None
    p = torch.full((rows,), sampler["top_p"], dtype=torch.float32, device=device) if (
        sampler.get("top_p") not in (None, 1.0)) else None
    return top_k_top_p(values, k, p).cpu()


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sampling", choices=("tiny", "study"), default="tiny")
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--kernel", default="installed", help="installed, or a vLLM wheel or its kernel's file")
    parser.add_argument("--top-p", type=float, default=None, help="this top_p instead of the study's")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    top_k_top_p, version = kernel(args.kernel)
    from benchlib import against_q, sampled_logits

    from grpo_equivalence.checks import scoring
    from grpo_equivalence.training import faults
    from grpo_equivalence.training.vllm_kernel import drop_weakest

    settings, logits = sampled_logits(args.sampling, args.prompts)
    if args.top_p is not None:
        settings = {**settings, "top_p": args.top_p}
    device = "cuda" if args.kernel == "installed" else "cpu"
    ids = torch.zeros((len(logits), 1), dtype=torch.long)
    rows, kept = {}, {}
    for name in ("correct", "temperature_up", "temperature_down"):
        sampler = settings if name == "correct" else faults.sampler_settings(name, settings)
        exact = scoring.processors(sampler, "vllm")(ids, logits.clone())
        ran = vllm_sampler(logits, sampler, top_k_top_p, device)
        mine, theirs = torch.isfinite(exact), torch.isfinite(ran)
        # the CPU stand-in (the drop_weakest fault's rule): the exact filters, then the kernel's rule on what top-p
        # chose among
        survivors = torch.isfinite(scoring.processors({**sampler, "top_k": None, "top_p": None}, "vllm")(
            ids, logits.clone())).sum(-1)
        rule = torch.isfinite(drop_weakest(scoring.processors({**sampler, "top_p": None}, "vllm")(ids, logits.clone()),
                                          exact.clone(), survivors, sampler.get("top_k"), sampler.get("top_p")))
        several = mine.sum(-1) > 1
        rows[name] = {"exact": against_q(logits, settings, exact),
                      "kernel": against_q(logits, settings, ran)}
        kept[name] = {"differs": float((mine != theirs).any(-1).float().mean()),
                      "kernel_drops": float((mine & ~theirs).sum(-1).float().mean()),
                      "kernel_adds": float((theirs & ~mine).sum(-1).float().mean()),
                      "several_kept": float(several.float().mean()),
                      "only_top_kept": float((several & (theirs.sum(-1) == 1)).float().mean()),
                      "stand_in_differs": float((rule != theirs).any(-1).float().mean())}
    effects = {name: {side: {key: rows[name][side][key] - rows["correct"][side][key] for key in ("score", "outside")}
                      for side in ("exact", "kernel")} for name in ("temperature_up", "temperature_down")}
    result = {"sampling": settings, "positions": len(logits), "kernel": args.kernel if args.kernel == "installed"
              else f"{KERNEL_FILE} of {Path(args.kernel).name}, Triton's interpreter", "vllm": version, "kept": kept,
              "expected": rows, "fault_effects": effects}
    print(f"{len(logits)} positions, {args.sampling} sampling {settings}, kernel: {result['kernel']} (vLLM {version})")
    print("| sampler | kept set differs | tokens dropped a position | only the top kept where several are | "
          "score under q, exact / kernel | outside q, exact / kernel |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, sides in rows.items():
        exact, ran, k = sides["exact"], sides["kernel"], kept[name]
        print(f"| {name} | {k['differs']:.3f} | {k['kernel_drops']:.3f} | {k['only_top_kept']:.3f} of "
              f"{k['several_kept']:.3f} | {exact['score']:+.4f} / {ran['score']:+.4f} | {exact['outside']:.5f} / "
              f"{ran['outside']:.5f} |")
    for name, sides in effects.items():
        exact, ran = sides["exact"], sides["kernel"]
        print(f"{name}: effect on the score, exact {exact['score']:+.5f}, kernel {ran['score']:+.5f} (beside the "
              f"kernel's own correct sampler); on the outside rate {exact['outside']:+.5f}, {ran['outside']:+.5f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
