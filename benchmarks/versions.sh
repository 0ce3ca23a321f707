#!/usr/bin/env bash
# The package versions and GPUs a GPU benchmark ran with, into FILE (the examples' versions.txt).
# Usage: benchmarks/versions.sh FILE
python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|trl|peft|accelerate|datasets|unsloth|unsloth.zoo|vllm|liger.kernel|snakemake|triton) " > "$1" || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$1" || true
