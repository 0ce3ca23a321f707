#!/usr/bin/env bash
# The tiny study packed on one GPU: BACKENDS (default all six) at STEPS steps (default 30), SEEDS seeds each (default 8,
# paired: seeds SEED.. for every backend, SEED by default the tiny study's 3407), REFERENCE (default vllm), the
# rollout check of every backend, up to JOBS jobs on the GPU at once (default 16; gpu_sharing), each backend's
# study-seed run alone on the GPU (its speed and memory are the report's), after the other seeds
# (SPEED_RUNS=last, the default: with the compile caches they filled) or before them (first: it measures what
# they ask for), the other seeds packed beside each other, each asking MEMORY_GB of the GPU (default 3; "none":
# what the backend's alone run measured, with first). Both vLLM engines reserve VLLM_SHARE of the GPU (default
# 0.1) beside that. Writes the study, report, statistics, rollout checks, logs, versions and the makespan to
# OUTDIR; benchmarks/packing_results.py OUTDIR turns them into the figures. HIDDEN sets the tiny model's width (default
# the study's 128; its vocabulary is padded past it); DEADLINE (s) stops the workflow in time to copy what finished
# when the machine's time is short, and the same command run again resumes it (jobs a deadline cut rerun).
# SNAKEMAKE_ARGS goes to Snakemake as it is: "--until train" trains the runs alone, e.g. the backends a machine
# without vLLM can train, which the whole study then restores from the run cache (results/cache/runs, keyed
# without the study's other backends or its reference) on a machine of the same GPU model.
# Usage: benchmarks/gpu_packed_study.sh [OUTDIR]
set -uo pipefail
out=$(realpath -m "${1:-results/gpu-packed}")
mkdir -p "$out"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python3 - "$out/study.yaml" "${SEEDS:-8}" "${STEPS:-30}" "${JOBS:-16}" "${VLLM_SHARE:-0.1}" "${SPEED_RUNS:-last}" \
  "${MEMORY_GB:-3}" "${SEED:-}" "${BACKENDS:-vllm unsloth_fi_false cb_paged hf hf_static trl_vllm}" \
  "${REFERENCE:-vllm}" "${HIDDEN:-}" <<'PY'
import sys, yaml
config = yaml.safe_load(open("studies/tiny.yaml"))
if sys.argv[8]:  # other seeds than the study's: runs that no earlier version of the method was read on
    config["grpo"]["seed"] = int(sys.argv[8])
if sys.argv[11]:
    config["tiny"]["hidden_size"] = int(sys.argv[11])
seeds, steps, jobs, share = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
speed_runs, memory = sys.argv[6], None if sys.argv[7] == "none" else float(sys.argv[7])
config.update(backends=sys.argv[9].split(), reference=sys.argv[10],
              steps=[steps], replicates={"reference": seeds, "others": seeds}, gpus_per_train_job=1, dtype="bfloat16",
              train_threads=1, gpu_sharing={"jobs_per_gpu": jobs, "memory_gb": memory, "speed_runs": speed_runs})
config["backend_options"].update(vllm={"gpu_memory_utilization": share}, trl_vllm={"gpu_memory_utilization": share})
yaml.safe_dump(config, open(sys.argv[1], "w"), sort_keys=False)
PY
start=$(date +%s)
echo "started $start" > "$out/progress.log"
# The device's and the machine's load while the study runs, every 10 s (where the time goes when jobs wait)
( echo "s,gpu_memory_mib,gpu_utilisation_pct,load_1min"
  while sleep 10; do
    echo "$(( $(date +%s) - start )),$(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits \
      2>/dev/null | head -1 | tr -d ' '),$(cut -d' ' -f1 /proc/loadavg)"
  done ) > "$out/gpu.csv" &
sampler=$!
# A call cut short (the machine's own limit, past DEADLINE) leaves Snakemake's lock: lifted where no Snakemake runs here
pgrep -f "snakemake results/grpo_equivalence.md" >/dev/null || python3 -m snakemake results/grpo_equivalence.md --unlock \
  --config study="$out/study.yaml" results=results >/dev/null 2>&1
# TERM at DEADLINE, KILL 30 s later: Snakemake waits for its jobs to stop, and the copy below must still run
timeout -k 30 "${DEADLINE:-0}" python3 -m snakemake results/grpo_equivalence.md --cores "${CORES:-16}" --resources gpu=1 --config study="$out/study.yaml" results=results \
  --keep-going --rerun-incomplete ${SNAKEMAKE_ARGS:-} > "$out/snakemake.log" 2>&1
echo "snakemake exit $?" >> "$out/progress.log"
kill "$sampler" 2>/dev/null
echo "makespan_s $(( $(date +%s) - start ))" | tee -a "$out/snakemake.log" >> "$out/progress.log"
cp results/grpo_equivalence.md "$out/" 2>/dev/null
mkdir -p "$out/stats" "$out/rollout" "$out/trainer" "$out/logs" "$out/figures"
cp results/stats/*.json "$out/stats/" 2>/dev/null
cp results/rollout/*.json "$out/rollout/" 2>/dev/null
cp results/trainer/*.json "$out/trainer/" 2>/dev/null
cp results/figures/*.png "$out/figures/" 2>/dev/null
cp -r results/logs/. "$out/logs/"
bash benchmarks/versions.sh "$out/versions.txt"
echo "done" >> "$out/progress.log"
