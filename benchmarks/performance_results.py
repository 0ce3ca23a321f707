"""The figures of a speed study, per backend, from its statistics files: results.json of docs/performance/.

    python benchmarks/performance_results.py STATS_DIR STUDY_FILE > results.json
    python benchmarks/performance_results.py --markdown results.json      (the README's table)

Every figure comes from a run's summary (grpo_equivalence.analysis.summary), i.e. from what the train job recorded;
a figure a run did not record is null.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
import yaml  # noqa: E402

from grpo_equivalence.analysis import runs, stats  # noqa: E402
from grpo_equivalence.analysis.summary import summarise  # noqa: E402
from grpo_equivalence.report import render  # noqa: E402

FIGURES = ("median_step_s", "median_rollout_s", "median_weight_sync_s", "median_training_s", "decode_ms_per_step",
           "bandwidth_floor_ms", "rollout_tokens_per_s", "startup_s", "peak_mem_gb", "peak_allocated_gb",
           "peak_reserved_gb", "vllm_reserved_gb")


def results(stats_dir: Path, study: dict) -> dict:
    shape = Path((study.get("random_model") or {}).get("architecture", study["model"])).stem
    paths = render.stats_files(stats_dir)  # gzipped too, as the examples keep them
    groups = runs.group_runs(runs.load_runs(paths))
    backends = {}
    for (backend, _), group in sorted(groups.items()):
        run = group[0]  # the study's seed
        summary = summarise(run, study.get("median_skip_steps", 3))
        figures = {key: summary.get(key) for key in FIGURES}
        figures["rollout_s"] = figures.pop("median_rollout_s")
        figures["peak_device_gb"] = figures.pop("peak_mem_gb")
        figures["decode_over_floor"] = (figures["decode_ms_per_step"] / figures["bandwidth_floor_ms"]
                                        if figures["decode_ms_per_step"] and figures["bandwidth_floor_ms"] else None)
        figures["steps"] = run["max_steps"]
        figures["median_over_steps"] = summary["median_over_steps"]
        backends[backend] = figures
    commits = {run["environment"].get("git_commit") for group in groups.values() for run in group}
    # The floor of the weights every backend reads: the base model's, i.e. the least over the runs (a run whose
    # adapters are float32 reads a little more)
    floors = [f["bandwidth_floor_ms"] for f in backends.values() if f["bandwidth_floor_ms"]]
    return {"shape": shape, "commit": sorted(c for c in commits if c) or None,
            "bandwidth_floor_ms": min(floors) if floors else None,
            "settings": {k: study["grpo"][k] for k in ("per_device_train_batch_size", "num_generations",
                                                       "max_completion_length")},
            "backends": {shape: backends}}


def markdown(data: dict) -> str:
    ref = data["backends"][data["shape"]].get("vllm", {}).get("decode_ms_per_step")
    lines = ["| Backend | Median step (s) | Rollout (s) | Training (s) | Decode (ms/step) | x vLLM decode | x floor | "
             "Rollout tok/s | Start-up (s) | Peak device (GB) | Peak allocated (GB) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    fmt = lambda v, d: "not recorded" if v is None else f"{v:.{d}f}"  # noqa: E731

    def ratio(decode):
        if "vllm" not in data["backends"][data["shape"]]:
            return "no vllm run"  # a study of other backends: nothing to divide by, not a missing figure
        return fmt(decode / ref if ref and decode else None, 2)

    for name, f in data["backends"][data["shape"]].items():
        lines.append(f"| {name} | {fmt(f['median_step_s'], 2)} | {fmt(f['rollout_s'], 2)} | {fmt(f['median_training_s'], 2)} "
                     f"| {fmt(f['decode_ms_per_step'], 2)} | {ratio(f['decode_ms_per_step'])} "
                     f"| {fmt(f['decode_over_floor'], 1)} | {fmt(f['rollout_tokens_per_s'], 0)} | {fmt(f['startup_s'], 0)} "
                     f"| {fmt(f['peak_device_gb'], 1)} | {fmt(f['peak_allocated_gb'], 1)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1] == "--markdown":
        sys.stdout.write(markdown(json.loads(Path(sys.argv[2]).read_text())))
    else:
        sys.stdout.write(stats.to_json(results(Path(sys.argv[1]), yaml.safe_load(Path(sys.argv[2]).read_text()))))
