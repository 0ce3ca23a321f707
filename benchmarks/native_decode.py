"""The native backend's decode step beside vLLM's, on a real architecture with random weights (GPU only).

    python benchmarks/native_decode.py [--architecture studies/architectures/qwen3-4b.json] [--batches 4 16 64]
                                       [--vllm] [--out FILE]

Per batch size: prompts of --prompt tokens, --tokens new ones with no end token (every sequence runs to the
end, so every backend decodes the same number of steps), the sampling of studies/speed-4b.yaml. The native
decoder runs on a PEFT model with the study's LoRA (merged for the rollout, as in training); vLLM (--vllm, in the
same process afterwards, the native model freed first) on the bare base model, as vLLM 0.26 alone. ms per
decode step = (time for N new tokens - time for 2) / (N - 2), median of 3; the native decoder's first call
(compilation and graph capture) and its peak allocated memory beside. Prints one line per measurement and the
bandwidth floor (the weights' bytes over a copy kernel's bandwidth); --out writes the figures as JSON.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # CUDA is initialised before vLLM starts
    import torch
    import yaml
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, GenerationConfig

    from grpo_equivalence.runtime.memory import device_bandwidth_gbs
    from grpo_equivalence.training.decoder import model as decoder
    from grpo_equivalence.training.random_model import load_architecture, model_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--architecture", default=str(ROOT / "studies/architectures/qwen3-4b.json"))
    parser.add_argument("--study", default=str(ROOT / "studies/speed-4b.yaml"), help="sampling and LoRA from here")
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--vllm", action="store_true", help="also time vLLM on the same shape")
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (eager decoder, no floor)")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    study = yaml.safe_load(Path(args.study).read_text())
    grpo = study["grpo"]
    sampling = {k: grpo[k] for k in ("temperature", "top_k", "top_p", "min_p")}
    config = model_config(load_architecture(args.architecture))
    torch.manual_seed(0)
    with torch.device(args.device):
        base = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if cuda else torch.float32)
    weights = sum(p.numel() * p.element_size() for p in base.parameters())
    floor_ms = 1000 * weights / (device_bandwidth_gbs() * 1e9) if cuda else None
    results = {"architecture": Path(args.architecture).stem, "prompt": args.prompt, "tokens": args.tokens,
               "sampling": sampling, "weights_gb": weights / 1e9, "bandwidth_floor_ms": floor_ms, "batches": {}}
    say = lambda line: print(line, flush=True)  # noqa: E731
    over = lambda ms: f"{ms / floor_ms:.1f} x floor" if floor_ms else "no floor on the CPU"  # noqa: E731
    say(f"{results['architecture']}: {weights / 1e9:.2f} GB of weights, floor {floor_ms or float('nan'):.2f} ms per "
        f"decode step")

    def save():
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")

    lora = {k: v for k, v in study["lora"].items()}
    model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **lora))
    native = decoder.Decoder(model)
    ids = lambda b: torch.randint(0, config.vocab_size, (b, args.prompt)).tolist()  # noqa: E731

    def native_run(prompts, new):
        generation = GenerationConfig(do_sample=True, max_new_tokens=new, **sampling)
        sync()
        began = time.perf_counter()
        with torch.no_grad():
            native.generate(prompts, generation, eos_ids=[], pad_id=0)
        sync()
        return time.perf_counter() - began

    for batch in args.batches:
        prompts = ids(batch)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        first = native_run(prompts, args.tokens) + native_run(prompts, 2)  # compiles and captures both shapes
        per_step = [(native_run(prompts, args.tokens) - native_run(prompts, 2)) / (args.tokens - 2) for _ in range(3)]
        ms = 1000 * statistics.median(per_step)
        steady = ms / 1000 * (args.tokens - 2) + 2 * native_run(prompts, 2)
        figures = {"native_ms": ms, "native_first_calls_s": first, "native_compile_and_capture_s": first - steady,
                   "native_peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None}
        results["batches"][str(batch)] = figures
        say(f"native, batch {batch}: {ms:.2f} ms per decode step ({over(ms)}), first calls "
            f"{first:.1f} s, peak allocated {figures['native_peak_allocated_gb'] or float('nan'):.1f} GB")
        save()
    if not args.vllm:
        return
    architectures = [type(base).__name__]  # vLLM picks its runner from these: without them, a pooling model
    del native, model, base
    torch.cuda.empty_cache()
    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as folder:
        config.architectures = architectures
        config.save_pretrained(folder)
        llm = LLM(model=folder, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", seed=0,
                  runner="generate", max_model_len=args.prompt + args.tokens, gpu_memory_utilization=0.6)

        def vllm_run(prompts, new):
            params = SamplingParams(max_tokens=new, min_tokens=new, ignore_eos=True, detokenize=False, **sampling)
            began = time.perf_counter()
            llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            return time.perf_counter() - began

        for batch in args.batches:
            prompts = ids(batch)
            vllm_run(prompts, args.tokens)
            ms = 1000 * statistics.median((vllm_run(prompts, args.tokens) - vllm_run(prompts, 2)) / (args.tokens - 2)
                                          for _ in range(3))
            figures = results["batches"].setdefault(str(batch), {})
            figures["vllm_ms"] = ms
            if "native_ms" in figures:
                figures["native_over_vllm"] = figures["native_ms"] / ms
            say(f"vllm, batch {batch}: {ms:.2f} ms per decode step ({over(ms)})" +
                (f"; native / vllm {figures['native_over_vllm']:.2f}" if "native_over_vllm" in figures else ""))
            save()


if __name__ == "__main__":
    main()
