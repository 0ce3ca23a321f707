#!/usr/bin/env bash
# The native backend's figures at real scale on one GPU, through Snakemake, in one go (each part in OUTDIR/<part>):
#   rollout4b: the rollout check of native against hf on the Qwen3-4B shape (studies/speed-4b.yaml), hf also at a
#              second seed (the control), all 64 prompts in one call (PER_CALL);
#   speed4, speed64: vllm and native trained 6 steps on that shape, each alone on the GPU, at batch 4 and 64
#              (the decode step against vllm's, start-up, memory: results.json of each).
# The parts share the study's random 4B model (results/random/model, built once). Set GRPO_EQUIVALENCE_COMMIT where
# the checkout has no history of its own (a copy of it), so that the runs name their commit.
# Usage: benchmarks/gpu_native_study.sh OUTDIR
set -uo pipefail
out=$(realpath -m "${1:?OUTDIR}")
mkdir -p "$out"
step() { echo "$1 exit $2 $(date +%s)" >> "$out/progress.log"; }
STUDY=studies/speed-4b.yaml BACKENDS="hf native" REFERENCE=hf PER_CALL="${PER_CALL:-64}" \
  bash benchmarks/gpu_rollout_check.sh "$out/rollout4b" > "$out/rollout4b.log" 2>&1
step rollout4b $?
for batch in 4 64; do
  BATCH=$batch BACKENDS="vllm native" STATS_ONLY=1 bash benchmarks/gpu_speed_study.sh "$out/speed$batch" 1 \
    > "$out/speed$batch.log" 2>&1
  step "speed$batch" $?
done
echo done >> "$out/progress.log"
