#!/usr/bin/env bash
# The tiny study on a GPU machine, through Snakemake, with every backend that can run there:
# hf, cb_paged and unsloth_fi_false at 10 and 30 steps, reference unsloth_fi_false, one GPU per train job.
# Writes the study's config, report, statistics and logs to OUTDIR (default: results/gpu-example).
# Usage: benchmarks/gpu_tiny_study.sh [OUTDIR] [GPUS]   (GPUS: the gpu resource, i.e. train jobs at once)
set -euo pipefail
out=${1:-results/gpu-example}
gpus=${2:-1}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python3 - "$out/study.yaml" <<'PY'
import sys, yaml
config = yaml.safe_load(open("studies/tiny.yaml"))
config.update(backends=["hf", "cb_paged", "unsloth_fi_false"], reference="unsloth_fi_false", steps=[10, 30],
              gpus_per_train_job=1, dtype="bfloat16", train_threads=4)
yaml.safe_dump(config, open(sys.argv[1], "w"), sort_keys=False)
PY
start=$(date +%s)
python3 -m snakemake results/grpo_equivalence.md --cores 16 --resources gpu="$gpus" --configfile "$out/study.yaml" \
  2>&1 | tee "$out/snakemake.log"
echo "makespan_s $(( $(date +%s) - start ))" | tee -a "$out/snakemake.log"
cp results/grpo_equivalence.md "$out/"
tar czf "$out/results.tar.gz" results/stats results/compare results/logs
python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|trl|peft|accelerate|datasets|unsloth|unsloth.zoo|snakemake|triton) " > "$out/versions.txt" || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$out/versions.txt" || true
