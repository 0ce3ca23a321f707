"""What a TRL + PEFT training step keeps for its backward pass, per token and layer, at a real architecture's shape.

The peak memory of a GRPO step without gradient checkpointing is the model's weights (and, for `native`, its merged
copy and KV cache) plus the activations the forward pass saves for the backward pass: those grow with the tokens
of a micro-batch and the layers. This counts them exactly, on the CPU, for the architecture's decoder layers in the
study's dtype with the study's LoRA on them, through PEFT as TRL applies it: every tensor autograd saves
(torch.autograd.graph.saved_tensors_hooks), each storage once, the parameters left out, by dtype; a layer's share is
two layers' count less one's.
The count does not depend on the device, except for the attention kernel (the CPU's SDPA saves what FlashAttention
saves: queries, keys, values, output and the log-sum-exp).

Variants, each in bfloat16 autocast as the trainer runs on a GPU (TRL's bf16 is accelerate's mixed precision, which
wraps the model's forward in torch.autocast) unless named `eager`: `default` (PEFT's adapters in float32 beside a
bfloat16 model, its default: every adapter casts its input to float32, which autocast casts back to a bfloat16
copy of its own for the matmul and keeps), `eager` (the same without autocast, as on the CPU: the float32 copies
are kept), `shared_inputs` (backends.base.share_adapter_inputs: PEFT's input cast skipped under autocast, whose matmul
then reads the bfloat16 input itself, which the adapters of one input share; bit for bit the same step, tests/test_backends.py),
`bf16_adapters` (autocast_adapter_dtype=False: adapters in the model's dtype), `checkpointing` (gradient
checkpointing: only each layer's input is kept; one layer's activations are recomputed at a time in the backward
pass), and where liger-kernel and Triton are installed, `liger` and `lean` (the configurations: Liger's RMSNorm,
SwiGLU and RoPE as TRL applies them, lean with shared inputs too). Liger's kernels are Triton GPU kernels: here
their launches are skipped, so that their autograd functions allocate and keep what they keep without computing it
(the count is of what is kept; the values are not used). They patch transformers' Qwen3 classes for the process,
so they run last.

    python benchmarks/activation_memory.py [--architecture studies/architectures/qwen3-4b.json] [--tokens 640]
        [--batch 4] [--out FILE]

prints, per variant, KB per token and layer and the activations of a micro-batch of `batch` sequences of `tokens`
tokens over all the architecture's layers, in GB.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

VARIANTS = ("eager", "default", "shared_inputs", "bf16_adapters", "checkpointing")
LIGER_VARIANTS = ("liger", "lean")  # last: Liger patches transformers' Qwen3 classes for the process
VOCABULARY = 1024  # the LM head is TRL's fused one, apart from these: a small vocabulary keeps the model small


def saved_per_token(architecture: dict, lora: dict, *, tokens: int, dtype: str, variant: str, layers: int) -> dict:
    """Bytes saved for the backward pass by the forward of `layers` decoder layers, per token, by dtype."""
    import torch
    from peft import get_peft_model

    from grpo_equivalence.training.backends.base import lora_config
    from grpo_equivalence.training.random_model import model_config
    from transformers import AutoModelForCausalLM

    config = model_config(architecture, num_hidden_layers=layers, vocab_size=VOCABULARY)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    if variant in LIGER_VARIANTS:
        import triton.runtime.jit
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3

        # the kernels' launches skipped (a CPU has no CUDA for them): what their functions keep is allocated all the same
        triton.runtime.jit.JITFunction.__getitem__ = lambda kernel, grid: (lambda *args, **kwargs: None)
        apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=False,
                                    model=model)
    model = get_peft_model(model, lora_config(lora), autocast_adapter_dtype=variant != "bf16_adapters")
    decoder = model.base_model.model.model
    if variant in ("shared_inputs", "lean"):
        from grpo_equivalence.training.backends.base import share_adapter_inputs

        share_adapter_inputs(model)
    if variant == "checkpointing":
        model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.base_model.model.enable_input_require_grads()
        model.train()
    seen = {p.untyped_storage().data_ptr() for p in model.parameters()}
    by_kind: Counter = Counter()

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            by_kind[str(tensor.dtype).removeprefix("torch.")] += storage.nbytes()
        return tensor

    ids = torch.randint(0, VOCABULARY, (1, tokens))
    autocast = torch.autocast("cpu", dtype=getattr(torch, dtype), enabled=variant != "eager" and dtype != "float32")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), autocast:
        decoder(input_ids=ids)
    return {kind: size / tokens for kind, size in by_kind.items()}


def main(argv=None) -> None:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--architecture", default="studies/architectures/qwen3-4b.json")
    parser.add_argument("--study", default="studies/speed-4b.yaml", help="its lora and dtype are used")
    parser.add_argument("--tokens", type=int, default=640, help="prompt and completion of one sequence (128 + 512)")
    parser.add_argument("--batch", type=int, default=4, help="sequences of a micro-batch")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args(argv)

    from grpo_equivalence.training.random_model import load_architecture

    architecture = load_architecture(ROOT / args.architecture)
    study = yaml.safe_load((ROOT / args.study).read_text())
    layers = architecture["num_hidden_layers"]
    rows = []
    print(f"{args.architecture}: {layers} layers, {args.batch} x {args.tokens} tokens a micro-batch, LoRA r "
          f"{study['lora']['r']} on {', '.join(study['lora']['target_modules'])}, {study['dtype']}")
    print("| Variant | KB per token and layer | of which float32 | KB per token, once | Activations of a micro-batch (GB) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    import importlib.util

    liger = all(importlib.util.find_spec(m) for m in ("liger_kernel", "triton"))
    if not liger:
        print(f"(liger-kernel or triton not installed: {', '.join(LIGER_VARIANTS)} left out)")
    for variant in VARIANTS + (LIGER_VARIANTS if liger else ()):
        # two layers less one: a layer's own, apart from what the model saves once (rotary tables, the final norm)
        one, two = (saved_per_token(architecture, study["lora"], tokens=args.tokens, dtype=study["dtype"],
                                    variant=variant, layers=n) for n in (1, 2))
        kinds = {kind: two.get(kind, 0) - one.get(kind, 0) for kind in set(one) | set(two)}
        per_token, once = sum(kinds.values()), sum(one.values()) - sum(kinds.values())
        total_gb = (per_token * layers + once) * args.tokens * args.batch / 1e9
        rows.append({"variant": variant, "bytes_per_token_layer": per_token, "by_dtype": kinds,
                     "bytes_per_token_once": once, "micro_batch_gb": total_gb})
        print(f"| {variant} | {per_token / 1024:.1f} | {kinds.get('float32', 0) / 1024:.1f} | {once / 1024:.1f} | "
              f"{total_gb:.2f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"architecture": args.architecture, "tokens": args.tokens,
                                              "batch": args.batch, "layers": layers, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
