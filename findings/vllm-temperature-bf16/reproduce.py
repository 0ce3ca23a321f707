"""vLLM 0.26's model runner V2 divides a bfloat16 model's logits by the temperature into bfloat16, then applies min_p.

vLLM 0.26 runs dense models on its model runner V2. Its sampler (vllm/v1/worker/gpu/sample/sampler.py) takes the
logits as the model's head computed them (bfloat16 for a bfloat16 model, unless `hf_overrides={"head_dtype":
"float32"}`), applies the temperature in place (`_temperature_kernel`, vllm/v1/worker/gpu/sample/gumbel.py: loads,
divides in float32, stores back into the logits' own dtype), then min_p in place (`_min_p_kernel`,
vllm/v1/worker/gpu/sample/min_p.py). Expected: the tokens min_p keeps of the logits divided by the temperature, as
TRL's trainer and transformers' warpers compute them (float32). Found: in bfloat16 the divided logits are rounded
to 8 significant bits; at temperature 0.1 a logit near 15 becomes 150, where bfloat16's step is 1.0, beside min_p
0.5's threshold of 0.69 below the top: min_p then keeps tokens the settings exclude and drops tokens they keep.

    python reproduce.py --kernel installed        # a CUDA GPU with vLLM installed: the kernels its sampler calls
    python reproduce.py --kernel VLLM_WHEEL       # any machine with triton: the kernels' source from the wheel, run
                                                  # by Triton's interpreter on the CPU

Needs torch and triton (and vLLM for `installed`); nothing of the workflow. Exits 1 while the defect is present,
printing every case; 0 when vLLM's kept set is the settings' wherever the logits are bfloat16.
"""

import argparse
import os
import re
import sys
import zipfile
from pathlib import Path

FILES = {"_temperature_kernel": "vllm/v1/worker/gpu/sample/gumbel.py", "_min_p_kernel": "vllm/v1/worker/gpu/sample/min_p.py"}
# What the kernels' source needs changed for Triton's interpreter: it passes an integer argument as an array of one,
# which its range() cannot take, so the vocabulary's size becomes a compile-time constant; it has no bfloat16
# constants, so min_p's -inf is chosen among float32 values (the bfloat16 logits exactly, and stored back as such)
INTERPRETED = {"    vocab_size,\n    BLOCK_SIZE": "    vocab_size: tl.constexpr,\n    BLOCK_SIZE",
               'float("-inf"), logits)': 'float("-inf"), logits.to(tl.float32))'}
ROWS, VOCABULARY = 64, 256
TEMPERATURE, MIN_P = 0.1, 0.5  # config.yaml's sampling of the study this was found in


def interpreted_kernels(wheel: Path) -> tuple:
    """The two kernels' source from the wheel, run by Triton's interpreter: (temperature, min_p) callables."""
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported
    import torch
    import triton
    import triton.language as tl

    namespace = {"triton": triton, "tl": tl}
    with zipfile.ZipFile(wheel) as archive:
        for name, member in FILES.items():
            text = archive.read(member).decode()
            found = re.search(rf"@triton\.jit\ndef {name}\(.*?(?=\n\n\n)", text, re.S)
            if not found:
                sys.exit(f"{wheel}: {member} no longer defines {name}; this script reads vLLM 0.26's")
            source = found.group(0)
            for before, after in INTERPRETED.items():
                source = source.replace(before, after)
            exec(compile(source, member, "exec"), namespace)

    def temperature(logits, value):
        mapping, temps = torch.zeros(len(logits), dtype=torch.int64), torch.tensor([value], dtype=torch.float32)
        namespace["_temperature_kernel"][(len(logits), 1)](logits, logits.stride(0), mapping, temps, logits.shape[1],
                                                          BLOCK_SIZE=8192)

    def min_p(logits, value):
        mapping, values = torch.zeros(len(logits), dtype=torch.int64), torch.tensor([value], dtype=torch.float32)
        namespace["_min_p_kernel"][(len(logits),)](logits, logits.stride(0), mapping, values, logits.shape[1],
                                                   BLOCK_SIZE=1024)

    return temperature, min_p, "cpu", f"{', '.join(FILES.values())} of vLLM {wheel.name.split('-')[1]}, Triton's interpreter"


def installed_kernels() -> tuple:
    import torch
    import vllm
    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature
    from vllm.v1.worker.gpu.sample.min_p import apply_min_p

    def temperature(logits, value):
        apply_temperature(logits, torch.zeros(len(logits), dtype=torch.int64, device=logits.device),
                          torch.tensor([value], dtype=torch.float32, device=logits.device))

    def min_p(logits, value):
        apply_min_p(logits, torch.zeros(len(logits), dtype=torch.int64, device=logits.device),
                    torch.tensor([value], dtype=torch.float32, device=logits.device))

    return temperature, min_p, "cuda", f"vLLM {vllm.__version__}, the kernels its V2 sampler calls"


def kept_by_vllm(raw, dtype, temperature, min_p, device):
    """The tokens vLLM's V2 sampler keeps after temperature and min_p, its logits in `dtype`."""
    logits = raw.to(dtype).to(device).clone()
    temperature(logits, TEMPERATURE)
    min_p(logits, MIN_P)
    return (logits != float("-inf")).cpu()


def kept_by_settings(raw):
    """min_p of the logits divided by the temperature in float64: what the settings keep."""
    import math

    scaled = raw.double() / TEMPERATURE
    return scaled >= scaled.max(dim=-1, keepdim=True).values + math.log(MIN_P)


def cases(generator):
    """(name, raw bfloat16 logits): constructed rows at the edge of min_p's threshold, and rows like a model's."""
    import torch

    def rows(top, gaps):
        raw = torch.full((len(gaps), VOCABULARY), top - 8.0)
        raw[:, 0] = top
        raw[:, 1] = top - torch.tensor(gaps)
        return raw.to(torch.bfloat16)

    # raw gaps (multiples of bfloat16's step at 15) that put the second token just inside or outside min_p's
    # threshold (0.0693 raw at temperature 0.1)
    yield "second token 0.0625 below a top of 15 (kept by the settings)", rows(15.0, [0.0625] * 16)
    yield "second token 0.0625 below a top of 15.0625 (kept by the settings)", rows(15.0625, [0.0625] * 16)
    yield "second token 0.125 below a top of 15.0625 (excluded by the settings)", rows(15.0625, [0.125] * 16)
    yield "second token 0.0625 below a top of 3 (kept by the settings)", rows(3.0, [0.0625] * 16)
    spread = torch.randn((ROWS, VOCABULARY), generator=generator) * 0.05
    yield "random rows, logits near 15 within 0.2", (15.0 + spread * 4).to(torch.bfloat16)
    yield "random rows, logits near 2 within 0.2", (2.0 + spread * 4).to(torch.bfloat16)


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", required=True, help='"installed", or the path of a vLLM 0.26 wheel')
    args = parser.parse_args()
    temperature, min_p, device, what = (installed_kernels() if args.kernel == "installed"
                                        else interpreted_kernels(Path(args.kernel)))
    print(f"kernels: {what}; temperature {TEMPERATURE}, min_p {MIN_P}, vocabulary {VOCABULARY}")
    print("| case | logits | rows where vLLM keeps another set | tokens kept that the settings exclude | "
          "tokens dropped that the settings keep |")
    print("| --- | --- | ---: | ---: | ---: |")
    generator, wrong = torch.Generator().manual_seed(0), False
    for name, raw in cases(generator):
        exact = kept_by_settings(raw)
        for dtype in (torch.bfloat16, torch.float32):
            kept = kept_by_vllm(raw, dtype, temperature, min_p, device)
            differ = (kept != exact).any(dim=-1)
            extra, missing = int((kept & ~exact).sum()), int((~kept & exact).sum())
            print(f"| {name} | {str(dtype).removeprefix('torch.')} | {int(differ.sum())} of {len(raw)} | {extra} | {missing} |")
            wrong |= bool(differ.any()) and dtype == torch.bfloat16
    print("DEFECT PRESENT: in bfloat16 vLLM's min_p keeps another set than the settings" if wrong
          else "no difference: vLLM's min_p keeps what the settings keep")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
