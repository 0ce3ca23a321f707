#!/usr/bin/env bash
# Speed and memory at real scale on a GPU machine, through Snakemake: a study of studies/ whose model is a real
# architecture with random weights (default studies/speed-4b.yaml), every backend of it, one GPU per train job.
# Writes the study's report, statistics, summaries, logs and versions to OUTDIR, and results.json (the figures
# per backend, benchmarks/performance_results.py).
# BACKENDS="vllm native" keeps only those backends of the study (the first one its reference).
# Usage: benchmarks/gpu_speed_study.sh [OUTDIR] [GPUS] [STUDY]   (GPUS: train jobs at once)
set -euo pipefail
out=$(realpath -m "${1:-results/gpu-speed}")
gpus=${2:-1}
mkdir -p "$out/stats" "$out/logs"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python3 - "${3:-studies/speed-4b.yaml}" "$out/study.yaml" "${BACKENDS:-}" <<'PY'
import sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
if sys.argv[3].split():
    config.update(backends=sys.argv[3].split(), reference=sys.argv[3].split()[0])
yaml.safe_dump(config, open(sys.argv[2], "w"), sort_keys=False)
PY
study="$out/study.yaml"
start=$(date +%s)
python3 -m snakemake results/grpo_equivalence.md --cores 16 --resources gpu="$gpus" --config study="$study" \
  --keep-going 2>&1 | tee "$out/snakemake.log" || true
echo "makespan_s $(( $(date +%s) - start ))" | tee -a "$out/snakemake.log"
cp results/grpo_equivalence.md "$out/" || true
cp results/stats/*.json "$out/stats/" || true
cp -r results/logs/. "$out/logs/"
python3 benchmarks/performance_results.py "$out/stats" "$study" > "$out/results.json"
bash benchmarks/versions.sh "$out/versions.txt"
