"""The figures of a packed study (benchmarks/gpu_packed_study.sh): what packing saved, and how much it decided.

    python benchmarks/packing_results.py OUTDIR [--reference vllm] [--json FILE]

- One at a time: the study's seed of every backend ran alone on the GPU, one after another (each waited for the
  GPU to empty); each such run's cost is its start-up plus its training.
- Packed: the other seeds shared the GPU; their cost per run is the span from the first one's start-up to the
  last one's end, over their number. The speed-up per run is the ratio of the two, measured in one go.
- Packing's cost to a run: its median step beside the alone run's, per backend.
- Decided: of the candidate x metric cells for kl, reward and completion length, the share the report calls
  equivalent or divergent (its verdicts, Holm over the report), and for the rest what the next look needs.
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from grpo_equivalence import report, runs as run_files, summary  # noqa: E402

DECIDING = ("kl", "reward", "completion_length")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--reference", default="vllm")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    runs = run_files.load_runs(report.stats_files(args.outdir / "stats"))
    alone = [r for r in runs.values() if summary.alone_on_gpu(r)]
    packed = [r for r in runs.values() if summary.alone_on_gpu(r) is False]
    cost = lambda r: (r.get("startup_s") or 0.0) + r["train_wall_s"]  # noqa: E731
    result = {"runs": len(runs), "alone_runs": len(alone), "packed_runs": len(packed)}
    if alone:
        result["alone_s_per_run"] = statistics.fmean(map(cost, alone))
        result["alone_total_s"] = sum(map(cost, alone))
    if packed:
        began = min(r["train_started_at"] - (r.get("startup_s") or 0.0) for r in packed)
        result["packed_span_s"] = max(r["train_finished_at"] for r in packed) - began
        result["packed_s_per_run"] = result["packed_span_s"] / len(packed)
        events = sorted([(r["train_started_at"], 1) for r in packed] + [(r["train_finished_at"], -1) for r in packed])
        running = most = 0
        for _, delta in events:
            running += delta
            most = max(most, running)
        result["most_runs_training_at_once"] = most
    if alone and packed:
        result["speedup_per_run"] = result["alone_s_per_run"] / result["packed_s_per_run"]
    log = args.outdir / "snakemake.log"
    if log.exists() and (m := re.search(r"makespan_s (\d+)", log.read_text())):
        result["makespan_s"] = int(m.group(1))
    slowdown = {}
    for backend in sorted({r["backend"] for r in runs.values()}):
        mine_alone = [summary.summarise(r)["median_step_s"] for r in alone if r["backend"] == backend]
        mine_packed = [summary.summarise(r)["median_step_s"] for r in packed if r["backend"] == backend]
        if mine_alone and mine_packed:
            slowdown[backend] = {"alone_median_step_s": statistics.median(mine_alone),
                                 "packed_median_step_s": statistics.median(mine_packed)}
    result["median_step"] = slowdown
    judged = report.judged(runs, args.reference)
    tables = report.step_tables(judged["summaries"], judged["comparisons"], run_files.group_runs(runs), args.reference)
    cells, open_cells = [], []
    for table in tables:
        for pair in table["pairs"]:
            for metric in DECIDING:
                v = pair["metrics"][metric]["verdict"]
                cells.append(v["verdict"])
                if v["verdict"] not in ("equivalent", "divergent"):
                    open_cells.append(f"{pair['candidate']} {metric} x {table['steps']}: {v['verdict']} "
                                      f"({v.get('reason', '')})")
    result["decided"] = {"cells": len(cells), "equivalent": cells.count("equivalent"),
                         "divergent": cells.count("divergent"),
                         "share": (cells.count("equivalent") + cells.count("divergent")) / len(cells) if cells else None,
                         "open": open_cells}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
