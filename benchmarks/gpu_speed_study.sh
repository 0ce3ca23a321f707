#!/usr/bin/env bash
# Speed and memory at real scale on a GPU machine, through Snakemake: a study of studies/ whose model is a real
# architecture with random weights (default studies/speed-4b.yaml), every backend of it, one GPU per train job.
# Writes the study's report, statistics, summaries, logs and versions to OUTDIR, and results.json (the figures
# per backend, benchmarks/performance_results.py).
# BACKENDS="vllm native" keeps only those backends of the study (the first one its reference); BATCH=64 sets the
# rollout's batch, the completions generated at once (gradient_accumulation_steps = BATCH / the study's
# per_device_train_batch_size: TRL generates for the whole optimizer step at once, then trains in micro-batches of
# the study's size, whose memory a 4B model's trainer can hold); GRPO='{use_liger_kernel: true}' merges those settings
# into the study's `grpo` (a YAML mapping: every backend of the study gets them); OPTIONS='{native: {unmerged_adapters:
# true}}' merges those into its `backend_options` (a configuration of that backend gets them too); STATS_ONLY=1 trains and records
# the runs without the rollout checks and the report (the speed figures need only the runs).
# Usage: benchmarks/gpu_speed_study.sh [OUTDIR] [GPUS] [STUDY]   (GPUS: train jobs at once)
set -euo pipefail
out=$(realpath -m "${1:-results/gpu-speed}")
gpus=${2:-1}
mkdir -p "$out/stats" "$out/logs"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python3 - "${3:-studies/speed-4b.yaml}" "$out/study.yaml" "${BACKENDS:-}" "${BATCH:-}" "${GRPO:-}" "${OPTIONS:-}" <<'PY'
import sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
if sys.argv[6]:
    extra = yaml.safe_load(sys.argv[6])
    if not isinstance(extra, dict) or not all(isinstance(v, dict) for v in extra.values()):
        sys.exit(f"OPTIONS={sys.argv[6]!r} is not a YAML mapping of backends to their options, e.g. "
                 "OPTIONS='{native: {unmerged_adapters: true}}'")
    options = config.setdefault("backend_options", {}) or {}
    for backend, values in extra.items():
        options[backend] = {**(options.get(backend) or {}), **values}
    config["backend_options"] = options
if sys.argv[5]:
    extra = yaml.safe_load(sys.argv[5])
    if not isinstance(extra, dict):
        sys.exit(f"GRPO={sys.argv[5]!r} is not a YAML mapping of GRPOConfig settings, e.g. GRPO='{{use_liger_kernel: true}}'")
    config["grpo"].update(extra)
if sys.argv[3].split():
    config.update(backends=sys.argv[3].split(), reference=sys.argv[3].split()[0])
if sys.argv[4]:
    batch, micro = int(sys.argv[4]), config["grpo"]["per_device_train_batch_size"]
    if batch % micro:
        sys.exit(f"BATCH={batch} is not a multiple of the study's per_device_train_batch_size {micro}")
    config["grpo"]["gradient_accumulation_steps"] = batch // micro
yaml.safe_dump(config, open(sys.argv[2], "w"), sort_keys=False)
PY
study="$out/study.yaml"
targets=results/grpo_equivalence.md
if [ "${STATS_ONLY:-0}" = 1 ]; then
  targets=$(python3 - "$study" <<'PY'
import sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
print(" ".join(f"results/stats/grpo_{b}_{n}.json" for b in config["backends"] for n in config["steps"]))
PY
)
fi
start=$(date +%s)
python3 -m snakemake $targets --cores 16 --resources gpu="$gpus" --config study="$study" results=results \
  --keep-going 2>&1 | tee "$out/snakemake.log" || true
echo "makespan_s $(( $(date +%s) - start ))" | tee -a "$out/snakemake.log"
cp results/grpo_equivalence.md "$out/" || true
cp results/stats/*.json "$out/stats/" || true
cp -r results/logs/. "$out/logs/"
python3 benchmarks/performance_results.py "$out/stats" "$study" > "$out/results.json"
bash benchmarks/versions.sh "$out/versions.txt"
