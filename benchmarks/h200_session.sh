#!/usr/bin/env bash
# Every GPU figure of docs/ from one session on a machine of two GPUs, from a checkout at one commit:
#   1. the tiny study, every backend, vllm the reference with REF_SEEDS seeds (gpu_tiny_study.sh), then the
#      statistics recorder's overhead on the tiny model (callback_overhead.py, the hardest case: short steps);
#   2. at the same time, the 4B-shape speed study (gpu_speed_study.sh).
# Both workflows lease GPUs from one pool (grpo_equivalence.runtime.gpus), so no two train jobs share a GPU.
# Each part runs in its own copy of the checkout, so that the two workflows' results/ stay apart.
# Usage: benchmarks/h200_session.sh OUTDIR
set -uo pipefail
out=$(realpath -m "${1:?OUTDIR}")
src=$(pwd)
mkdir -p "$out"
for part in tiny speed; do rm -rf "/tmp/session-$part" && cp -r "$src" "/tmp/session-$part"; done
(
  cd /tmp/session-tiny
  STEPS="${STEPS:-30}" REF_SEEDS="${REF_SEEDS:-3}" bash benchmarks/gpu_tiny_study.sh "$out/tiny" 2 > "$out/tiny.log" 2>&1
  echo "tiny study exit $?" >> "$out/progress.log"
  python3 benchmarks/callback_overhead.py --gpus 1 --steps 30 --pairs "${PAIRS:-2}" --out "$out/overhead.json" \
    > "$out/overhead.log" 2>&1
  echo "overhead exit $?" >> "$out/progress.log"
) &
(
  cd /tmp/session-speed
  bash benchmarks/gpu_speed_study.sh "$out/speed" 2 "${SPEED_STUDY:-studies/speed-4b.yaml}" > "$out/speed.log" 2>&1
  echo "speed study exit $?" >> "$out/progress.log"
) &
wait
echo "session done" >> "$out/progress.log"
