"""Where a transformers decode step's time goes, on a real architecture with random weights (GPU only).

    python benchmarks/decode_step.py [--architecture studies/architectures/qwen3-4b.json] [--batch 4] [--tokens 128]

Times generate() per decode step ((time for N new tokens - time for 1) / (N - 1), median of 2) in variants
that each remove one suspect: the study's sampling (temperature, top-k, top-p, min-p over the whole vocabulary)
against greedy decoding, LoRA adapters left unmerged (as during GRPO training) against none, a static cache
sized max_seq_length against one sized prompt + completion, eager against compiled. Prints one line per
variant and the bandwidth floor (weights' bytes over a copy kernel's bandwidth).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SAMPLING = {"do_sample": True, "temperature": 0.1, "top_k": 5, "top_p": 0.97, "min_p": 0.5}


def main() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, GenerationConfig

    from grpo_equivalence.runtime.memory import device_bandwidth_gbs
    from grpo_equivalence.training.random_model import load_architecture, model_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--architecture", default=str(ROOT / "studies/architectures/qwen3-4b.json"))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--max-seq-length", type=int, default=1024)
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    config = model_config(load_architecture(args.architecture))
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    weights = sum(p.numel() * p.element_size() for p in base.parameters())
    bandwidth = device_bandwidth_gbs()
    floor_ms = 1000 * weights / (bandwidth * 1e9)
    print(f"{Path(args.architecture).stem}: {weights / 1e9:.2f} GB of weights, copy bandwidth {bandwidth:.0f} GB/s, "
          f"floor {floor_ms:.2f} ms per decode step", flush=True)
    lora = get_peft_model(base, LoraConfig(r=32, lora_alpha=64, lora_dropout=0.0, task_type="CAUSAL_LM",
                                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"]))
    ids = torch.randint(0, config.vocab_size, (args.batch, args.prompt), device="cuda")

    def ms_per_step(model, **settings) -> float:
        def run(new):
            generation = GenerationConfig(max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=0,
                                          **settings)
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=generation)
            torch.cuda.synchronize()
            return time.perf_counter() - start

        run(args.tokens)  # compiles, captures graphs
        times = [(run(args.tokens) - run(1)) / (args.tokens - 1) for _ in range(2)]
        return 1000 * statistics.median(times)

    static = {"cache_implementation": "static", "disable_compile": False, "max_cache_len": args.max_seq_length}
    fitted = {**static, "max_cache_len": args.prompt + args.tokens}
    variants = [
        ("eager, LoRA, sampling (hf)", lora, {**SAMPLING, "disable_compile": True}),
        ("eager, LoRA, greedy", lora, {"do_sample": False, "disable_compile": True}),
        ("static+compiled, LoRA, sampling (hf_static)", lora, {**SAMPLING, **static}),
        ("static+compiled, LoRA, greedy", lora, {"do_sample": False, **static}),
        ("static+compiled, LoRA, sampling, cache prompt+completion", lora, {**SAMPLING, **fitted}),
    ]
    results = {"architecture": Path(args.architecture).stem, "batch": args.batch, "tokens": args.tokens,
               "weights_gb": weights / 1e9, "bandwidth_gbs": bandwidth, "bandwidth_floor_ms": floor_ms, "variants": {}}
    for name, model, settings in variants:
        ms = ms_per_step(model, **settings)
        results["variants"][name] = ms
        print(f"{name}: {ms:.2f} ms per decode step ({ms / floor_ms:.1f} x floor)", flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    with lora.disable_adapter():
        for name, settings in (("static+compiled, no LoRA, sampling", {**SAMPLING, **static}),
                               ("static+compiled, no LoRA, greedy", {"do_sample": False, **static})):
            ms = ms_per_step(lora, **settings)
            results["variants"][name] = ms
            print(f"{name}: {ms:.2f} ms per decode step ({ms / floor_ms:.1f} x floor)", flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
