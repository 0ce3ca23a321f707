#!/usr/bin/env bash
# The rollout check's fault benchmark (benchmarks/fault_detection.py) on a GPU machine, a row per sampling and dtype:
# the tiny study's sampling (temperature 1.0, min_p 0.05) and config.yaml's (temperature 0.1, min_p 0.5), each in
# float32 and in bfloat16, every check sampling and scoring on the GPU (JOBS at once). Writes each row's JSON and log
# to OUTDIR as it finishes (a call cut short keeps the rows done).
# Usage: benchmarks/gpu_fault_detection.sh [OUTDIR]
# Env: ROWS (default "tiny:float32 tiny:bfloat16 study:float32 study:bfloat16"; SAMPLING:DTYPE:ROUNDS caps a row's
# rounds), BACKEND (hf), REPS (20), JOBS (16),
# MAX_ROUNDS (4), MARGIN (the score test's temperature margin, 0.1: the schema's default), DEADLINE (seconds after which a row drops the checks still running and judges the whole repetitions done; 0: none), ROW_TIMEOUT (seconds a row may take, default 900), PER_CALL (prompts per generation call; default the study's 50),
# FIRST_SEED (the first repetition's reference seed, default 10000: another gives repetitions of their own),
# VLLM_SHARE (the GPU memory fraction each vLLM engine reserves; JOBS of them run at once), ORDER (the filters'
# order the check scores with; default the backend's sampler's: vLLM's for a vLLM backend), KEEP=1 (each row's check files, as
# OUTDIR/checks-ROW.tar.gz: what the counts were made of), EXACT_TOP_P=1 (trl_vllm with vLLM's sort-based top-k/top-p
# instead of its Triton kernel; the row's files end in -exact_top_p)
set -uo pipefail
out=${1:-results/gpu-faults}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
backend=${BACKEND:-hf}
for row in ${ROWS:-tiny:float32 tiny:bfloat16 study:float32 study:bfloat16}; do
  # a row is SAMPLING:DTYPE, or SAMPLING:DTYPE:ROUNDS with its own cap on the rounds
  IFS=: read -r sampling dtype rounds <<<"$row"
  variant=$([ "${EXACT_TOP_P:-0}" = 1 ] && echo "-exact_top_p")
  name="rollout-$backend-$sampling-$dtype$variant"
  timeout "${ROW_TIMEOUT:-900}" python3 benchmarks/fault_detection.py --gpu --reps "${REPS:-20}" --jobs "${JOBS:-16}" \
    --backend "$backend" --sampling "$sampling" --dtype "$dtype" --max-rounds "${rounds:-${MAX_ROUNDS:-4}}" --margin "${MARGIN:-0.1}" --deadline "${DEADLINE:-0}" \
    ${PER_CALL:+--per-call "$PER_CALL"} ${VLLM_SHARE:+--vllm-share "$VLLM_SHARE"} ${ORDER:+--order "$ORDER"} ${FIRST_SEED:+--first-seed "$FIRST_SEED"} \
    ${variant:+--exact-top-p} --out "$out/$name.json" 2>&1 | grep -v -e "Loading weights" -e "Warning" -e "warn" > "$out/$name.log"
  tail -12 "$out/$name.log"
  if [ "${KEEP:-0}" = 1 ]; then
    tar -czf "$out/checks-$backend-$sampling-$dtype$variant.tar.gz" -C results/benchmarks/fault_detection "$backend-$sampling-$dtype$variant"
  fi
done
bash benchmarks/versions.sh "$out/versions.txt"
