"""vLLM 0.26's top-k/top-p Triton kernel keeps one token too few where min_p left at most top_k and top_p needs them all.

vLLM's sampler applies temperature, then min_p (a logits processor: tokens below min_p x the top probability become
-inf), then top-k and top-p. From 8 sequences a step on, top-k and top-p run in a Triton kernel
(vllm/v1/sample/ops/topk_topp_triton.py). Expected: the tokens a sort-based top-k/top-p keeps (vLLM's own
apply_top_k_top_p_pytorch, the same as transformers' warpers). Found: where no more than top_k tokens are finite,
the kernel takes its top-p path alone, bisects for a probability threshold between the smallest and the largest
probability left, keeps the tokens strictly above it and stops after a fixed number of steps; where the nucleus needs
every finite token, the smallest is never kept. At temperature 0.1 and min_p 0.5 (two tokens allowed) such a sampler
is greedy.

    python reproduce.py --kernel installed        # a CUDA GPU with vLLM installed: the kernel vLLM's sampler calls
    python reproduce.py --kernel VLLM_WHEEL       # any machine with triton: the kernel's source from the wheel (or
                                                  # its topk_topp_triton.py), run by Triton's interpreter on the CPU

Needs torch and triton (and vLLM for `installed`); nothing of the workflow. Exits 1 while the defect is present,
printing every case; 0 when the kernel keeps what the sort-based filter keeps.
"""

import argparse
import os
import sys
import types
import zipfile
from pathlib import Path

KERNEL_FILE = "vllm/v1/sample/ops/topk_topp_triton.py"
# What the kernel's source needs changed to run outside vLLM, in Triton's interpreter, with a GPU's tile sizes
INTERPRETED = {
    "from vllm.triton_utils import tl, triton": "import triton\nimport triton.language as tl",
    "from vllm.utils.math_utils import next_power_of_2":
        "def next_power_of_2(n):\n    return 1 << (n - 1).bit_length()",
    "from vllm.utils.platform_utils import num_compute_units": "def num_compute_units(index=None):\n    return 132",
    "row_id.to(tl.int64) * LOGITS_STRIDE_0": "row_id * LOGITS_STRIDE_0",  # the interpreter's loop index is an int
    'if logits.device.type == "cpu":': "if False:  # the GPU's tile sizes",
}
ROWS = 16  # a step of 8 sequences or more goes to the kernel
VOCABULARY = 256
TOP_K, TOP_P, TEMPERATURE, MIN_P = 5, 0.97, 0.1, 0.5  # config.yaml's sampling of the study this was found in


def load_kernel(source: str):
    """(the kernel's top-k/top-p function, its device, a description)."""
    if source == "installed":
        import vllm
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

        return apply_top_k_top_p, "cuda", f"vLLM {vllm.__version__}, apply_top_k_top_p as its sampler calls it"
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported
    path, version = Path(source), "?"
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            text = wheel.read(KERNEL_FILE).decode()
            version = path.name.split("-")[1]
    else:
        text = path.read_text()
    for old, new in INTERPRETED.items():
        if old not in text:
            sys.exit(f"{source}: the kernel's source no longer has {old!r}; this script reads vLLM 0.26's")
        text = text.replace(old, new)
    module = types.ModuleType("topk_topp_triton")
    exec(compile(text, KERNEL_FILE, "exec"), module.__dict__)
    return module.apply_top_k_top_p_triton, "cpu", f"{KERNEL_FILE} of vLLM {version}, Triton's interpreter"


def sort_based(logits, k, p):
    """Top-k then top-p by sorting (what vLLM's apply_top_k_top_p_pytorch and transformers' warpers keep)."""
    import torch

    values = logits.clone()
    if k is not None:
        kth = values.topk(int(k[0]), dim=-1).values[:, -1:]
        values[values < kth] = -float("inf")
    if p is not None:
        ordered, index = values.sort(dim=-1, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= 1 - p[:, None]
        remove[:, -1] = False
        values = values.scatter(1, index, ordered.masked_fill(remove, -float("inf")))
    return values


def cases(generator):
    """(name, logits after temperature and min_p, top_p): rows as vLLM's sampler hands them to the kernel."""
    import math

    import torch

    found = []
    for m in (2, 3, 4, 5):  # m tokens survive min_p, each within temperature x ln 2 of the top: top_p needs all
        raw = -torch.rand((ROWS, m), generator=generator) * TEMPERATURE * math.log(1 / MIN_P) * 0.9
        raw[:, 0] = 0.0
        logits = torch.full((ROWS, VOCABULARY), -float("inf"))
        logits[:, :m] = raw / TEMPERATURE
        found.append((f"{m} tokens left by min_p, the rest -inf", logits, TOP_P))
        finite = logits.clone()
        finite[:, m:] = -60.0  # the same rows, the rest finite far below
        found.append((f"{m} tokens, the rest finite (-60)", finite, TOP_P))
        found.append((f"{m} tokens left by min_p, top_p 1.0", logits.clone(), 1.0))
    # rows as the tiny study samples them (temperature 1.0, min_p 0.05): min_p applied to random logits
    raw = torch.randn((ROWS, VOCABULARY), generator=generator) * 2.0
    probs = raw.softmax(-1)
    random_rows = raw.masked_fill(probs < 0.05 * probs.amax(-1, keepdim=True), -float("inf"))
    found.append(("random logits, min_p 0.05 at temperature 1.0", random_rows, TOP_P))
    return found


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", required=True, help="installed, or a vLLM wheel, or its topk_topp_triton.py")
    args = parser.parse_args()
    kernel, device, described = load_kernel(args.kernel)
    print(f"kernel: {described}; {ROWS} rows a case, vocabulary {VOCABULARY}, top_k {TOP_K}")
    print("| case | top_p | rows keeping fewer tokens than the sort-based filter | tokens kept (filter -> kernel) |")
    print("| --- | ---: | ---: | --- |")
    generator = torch.Generator().manual_seed(0)
    defect = False
    for name, logits, top_p in cases(generator):
        k = torch.full((ROWS,), TOP_K, dtype=torch.int32)
        p = torch.full((ROWS,), top_p, dtype=torch.float32) if top_p < 1.0 else None
        expected = torch.isfinite(sort_based(logits, k, p))
        got = torch.isfinite(kernel(logits.clone().to(device), k.to(device), None if p is None else p.to(device)).cpu())
        fewer = ((got & ~expected).sum(-1) == 0) & ((expected & ~got).sum(-1) > 0)
        other = (got != expected).any(-1) & ~fewer
        counts = sorted({(int(e), int(g)) for e, g in zip(expected.sum(-1), got.sum(-1), strict=True)})
        print(f"| {name} | {top_p} | {int(fewer.sum())} of {ROWS}{f' (other differences: {int(other.sum())})' if other.any() else ''}"
              f" | {', '.join(f'{e} -> {g}' for e, g in counts)} |")
        defect |= bool(fewer.any() or other.any())
    print("DEFECT PRESENT: the kernel keeps fewer tokens than top_k/top_p ask" if defect else
          "the kernel keeps what the sort-based filter keeps")
    return 1 if defect else 0


if __name__ == "__main__":
    sys.exit(main())
