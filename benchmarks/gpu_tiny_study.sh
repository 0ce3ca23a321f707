#!/usr/bin/env bash
# The tiny study on a GPU machine, through Snakemake, with every backend: vllm (the reference, as in the
# original study, with REF_SEEDS seeds for the noise floor; default 3), unsloth_fi_false, cb_paged, hf, hf_static
# and trl_vllm (OTHER_SEEDS seeds each; default 1) at STEPS steps (default "10 30"), one GPU per train job,
# bfloat16. Both vLLM backends reserve the same fraction of the GPU, so that their memory compares.
# Writes the study's config, report, statistics, comparisons, logs and versions to OUTDIR.
# Usage: benchmarks/gpu_tiny_study.sh [OUTDIR] [GPUS]   (GPUS: the gpu resource, i.e. train jobs at once)
set -euo pipefail
out=${1:-results/gpu-example}
gpus=${2:-1}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python3 - "$out/study.yaml" "${REF_SEEDS:-3}" "${OTHER_SEEDS:-1}" "${STEPS:-10 30}" <<'PY'
import sys, yaml
config = yaml.safe_load(open("studies/tiny.yaml"))
config.update(backends=["vllm", "unsloth_fi_false", "cb_paged", "hf", "hf_static", "trl_vllm"], reference="vllm",
              steps=[int(s) for s in sys.argv[4].split()],
              gpus_per_train_job=1, dtype="bfloat16", train_threads=4)
config["backend_options"].update(vllm={"gpu_memory_utilization": 0.3}, trl_vllm={"gpu_memory_utilization": 0.3})
config["replicates"] = {"reference": int(sys.argv[2]), "others": int(sys.argv[3])}
yaml.safe_dump(config, open(sys.argv[1], "w"), sort_keys=False)
PY
start=$(date +%s)
python3 -m snakemake results/grpo_equivalence.md --cores 16 --resources gpu="$gpus" --config study="$out/study.yaml" results=results \
  --keep-going 2>&1 | tee "$out/snakemake.log" || true  # what did run is still copied below
echo "makespan_s $(( $(date +%s) - start ))" | tee -a "$out/snakemake.log"
cp results/grpo_equivalence.md "$out/" || true
mkdir -p "$out/stats" "$out/compare" "$out/logs" "$out/figures"
cp results/stats/*.json "$out/stats/" && cp results/compare/*.json "$out/compare/" || true
cp results/figures/*.png "$out/figures/" || true
cp -r results/logs/. "$out/logs/"
bash benchmarks/versions.sh "$out/versions.txt"
