#!/usr/bin/env bash
# The native backend's figures at real scale on one GPU, through Snakemake, in one go (each part in OUTDIR/<part>):
#   rollout4b: the rollout check of native against hf on the Qwen3-4B shape (studies/speed-4b.yaml), hf also at a
#              second seed (the control; CONTROL=0 leaves it out), all 64 prompts in one call (PER_CALL), each
#              sampled ROUNDS x 4 times (default 1);
#   speed4, speed64: vllm and native trained 6 steps on that shape, each alone on the GPU, at batch 4 and 64
#              (the decode step against vllm's, start-up, memory: results.json of each); SPEED_BACKENDS="native"
#              leaves vllm out (a machine without vLLM);
#   BACKEND@BATCH, BACKEND@BATCHgc: one backend of the study alone at that batch (native+lean@64, hf_static+liger@4: a
#              backend with a configuration, grpo_equivalence.training.faults.CONFIGURATIONS), with gc gradient
#              checkpointing (native@4gc).
# The parts share the study's random 4B model (results/random/model, built once). Set GRPO_EQUIVALENCE_COMMIT where
# the checkout has no history of its own (a copy of it), so that the runs name their commit.
# PARTS picks the parts and their order (default "rollout4b speed4 speed64"): with little GPU time left, the first.
# Usage: benchmarks/gpu_native_study.sh OUTDIR
set -uo pipefail
out=$(realpath -m "${1:?OUTDIR}")
mkdir -p "$out"
step() { echo "$1 exit $2 $(date +%s)" >> "$out/progress.log"; }
for part in ${PARTS:-rollout4b speed4 speed64}; do
  case $part in
    rollout4b)
      STUDY=studies/speed-4b.yaml BACKENDS="hf native" REFERENCE=hf PER_CALL="${PER_CALL:-64}" \
        bash benchmarks/gpu_rollout_check.sh "$out/rollout4b" > "$out/rollout4b.log" 2>&1 ;;
    speed4|speed64)
      BATCH=${part#speed} BACKENDS="${SPEED_BACKENDS:-vllm native}" STATS_ONLY=1 \
        bash benchmarks/gpu_speed_study.sh "$out/$part" 1 > "$out/$part.log" 2>&1 ;;
    *@[0-9]*)
      batch=${part#*@} grpo="{}"
      [ "${batch%gc}" != "$batch" ] && grpo="{gradient_checkpointing: true}"
      dir=${part//[+@]/-}  # plain file names (native-lean-4)
      BATCH=${batch%gc} BACKENDS=${part%@*} GRPO="$grpo" STATS_ONLY=1 \
        bash benchmarks/gpu_speed_study.sh "$out/$dir" 1 > "$out/$dir.log" 2>&1 ;;
    *) echo "unknown part $part: PARTS takes rollout4b, speed4, speed64 and BACKEND@BATCH[gc]" >&2; exit 2 ;;
  esac
  step "$part" $?
done
echo done >> "$out/progress.log"
