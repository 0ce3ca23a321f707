#!/usr/bin/env bash
# The rollout check on a GPU machine, through Snakemake, for every backend of the H200 example
# (docs/examples/h200-vllm-reference: the tiny study in bfloat16, vllm the reference, both vLLM backends at
# gpu_memory_utilization 0.3), the reference also at a second seed (the control), and one sampling fault on each
# vLLM path (Unsloth's and TRL's), which the check must call divergent. No training.
# Writes the study, the rollout-check files, their logs and the versions to OUTDIR.
# Usage: benchmarks/gpu_rollout_check.sh [OUTDIR]
# Env: BACKENDS (space-separated, default all of the above), REFERENCE (default vllm), ORDER (rollout_check.order,
# default transformers), CONTROL (1: also the reference at a second seed; default 1), STUDY (another study file,
# e.g. studies/speed-4b.yaml, taken as it is but for these settings), PER_CALL (rollout_check.prompts_per_call),
# ROUNDS (rollout_check.rounds: the rounds before the check plans its size), MAX_ROUNDS (rollout_check.max_rounds: the
# cap of the rounds it samples to reach its plan), JOBS_PER_GPU (gpu_sharing.jobs_per_gpu, with MEMORY_GB a job).
set -euo pipefail
out=${1:-results/gpu-rollout}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python3 - "$out/study.yaml" "${BACKENDS:-}" "${ORDER:-transformers}" "${REFERENCE:-vllm}" "${STUDY:-}" \
  "${PER_CALL:-}" "${ROUNDS:-}" "${MAX_ROUNDS:-}" "${JOBS_PER_GPU:-}" "${MEMORY_GB:-}" <<'PY'
import sys, yaml
study, per_call, rounds = sys.argv[5] or "studies/tiny.yaml", sys.argv[6], sys.argv[7]
max_rounds, jobs_per_gpu, memory_gb = sys.argv[8], sys.argv[9], sys.argv[10]
config = yaml.safe_load(open(study))
backends = sys.argv[2].split() or ["vllm", "unsloth_fi_false", "cb_paged", "hf", "hf_static", "trl_vllm",
                                   "vllm+temperature_up", "trl_vllm+no_min_p"]
config["rollout_check"] = {**config.get("rollout_check", {}), "order": sys.argv[3]}
if per_call:
    config["rollout_check"]["prompts_per_call"] = int(per_call)
if rounds:
    config["rollout_check"]["rounds"] = int(rounds)
if max_rounds:
    config["rollout_check"]["max_rounds"] = int(max_rounds)
if jobs_per_gpu:
    config["gpu_sharing"] = {**config.get("gpu_sharing", {}), "jobs_per_gpu": int(jobs_per_gpu),
                             "memory_gb": float(memory_gb or 40)}
config.update(backends=backends, reference=sys.argv[4])
if not sys.argv[5]:  # the H200 example's settings
    config.update(steps=[30], gpus_per_train_job=1, dtype="bfloat16", train_threads=4)
    config["backend_options"].update(vllm={"gpu_memory_utilization": 0.3}, trl_vllm={"gpu_memory_utilization": 0.3})
    config["replicates"] = {"reference": 3, "others": 1}
yaml.safe_dump(config, open(sys.argv[1], "w"), sort_keys=False)
PY
targets=$(python3 - "$out/study.yaml" "${CONTROL:-1}" <<'PY'
import sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
seed = config["grpo"]["seed"]
print(" ".join([f"results/rollout/{b}.json" for b in config["backends"]]
               + ([f"results/rollout/{config['reference']}_seed{seed + 1}.json"] if sys.argv[2] == "1" else [])))
PY
)
start=$(date +%s)
python3 -m snakemake $targets --cores 16 --resources gpu=1 --config study="$out/study.yaml" results=results --keep-going \
  2>&1 | tee "$out/snakemake.log" || true  # what did run is still copied below
echo "makespan_s $(( $(date +%s) - start ))" | tee -a "$out/snakemake.log"
mkdir -p "$out/rollout" "$out/logs"
cp results/rollout/*.json "$out/rollout/" || true
cp -r results/logs/rollout/. "$out/logs/" || true
bash benchmarks/versions.sh "$out/versions.txt"
