"""The figures of a packed study (benchmarks/gpu_packed_study.sh): what packing saved, and how much it decided.

    python benchmarks/packing_results.py OUTDIR [--reference vllm] [--json FILE]

- One at a time: the study's seed of every backend ran alone on the GPU, one after another (each waited for the
  GPU to empty); each such run's cost is its start-up plus its training.
- Packed: the other seeds shared the GPU; their cost per run is the span from the first one's start-up to the
  last one's end, over their number. The speed-up per run is the ratio of the two, measured in one go.
- Packing's cost to a run: its median step beside the alone run's, per backend.
- Waits (from the jobs' logs, OUTDIR/logs or OUTDIR/logs.tar.xz): the seconds jobs waited for a vLLM engine
  start to end, for the loads and exits beside an engine start, and for their settings' first run to compile;
  and the share of the packed span in which an engine start was under way (vLLM's "non-default args" line to
  its "init engine ... took" line).
- Decided: of the candidate x metric cells for kl, reward and completion length, the share the report calls
  equivalent or divergent (its verdicts, Holm over each comparison), and for the rest what the next look needs.
"""

import argparse
import datetime
import gzip
import io
import json
import re
import statistics
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import DECIDED, headline_cells  # noqa: E402

from grpo_equivalence.analysis import runs as run_files  # noqa: E402
from grpo_equivalence.analysis import summary  # noqa: E402
from grpo_equivalence.report import render  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--reference", default="vllm")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    runs = run_files.load_runs(render.stats_files(args.outdir / "stats"))
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
    text = log.read_text() if log.exists() else (gzip.decompress(log.with_suffix(".log.gz").read_bytes()).decode()
                                                 if log.with_suffix(".log.gz").exists() else "")
    if m := re.search(r"makespan_s (\d+)", text):
        result["makespan_s"] = int(m.group(1))
    if (waits := _waits(args.outdir, result.get("packed_span_s"), packed)) is not None:
        result["waits"] = waits
    slowdown = {}
    for backend in sorted({r["backend"] for r in runs.values()}):
        mine_alone = [summary.summarise(r)["median_step_s"] for r in alone if r["backend"] == backend]
        mine_packed = [summary.summarise(r)["median_step_s"] for r in packed if r["backend"] == backend]
        if mine_alone and mine_packed:
            slowdown[backend] = {"alone_median_step_s": statistics.median(mine_alone),
                                 "packed_median_step_s": statistics.median(mine_packed)}
    result["median_step"] = slowdown
    cells, open_cells = [], []
    for candidate, metric, steps, v in headline_cells(runs, args.reference):
        cells.append(v["verdict"])
        if v["verdict"] not in DECIDED:
            open_cells.append(f"{candidate} {metric} x {steps}: {v['verdict']} ({v.get('reason', '')})")
    result["decided"] = {"cells": len(cells), "equivalent": cells.count("equivalent"),
                         "divergent": cells.count("divergent"),
                         "share": (cells.count("equivalent") + cells.count("divergent")) / len(cells) if cells else None,
                         "open": open_cells}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return result


WAITED = re.compile(r"^waited (\d+) s for (.+)$", re.M)
VLLM_TIME = r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) \[{}"


def _logs(outdir: Path) -> dict[str, str] | None:
    """Every job log's text by its path under logs/, from the folder or its xz archive."""
    if (outdir / "logs").is_dir():
        return {str(p.relative_to(outdir)): p.read_text(errors="replace") for p in (outdir / "logs").rglob("*.log")}
    if (archive := outdir / "logs.tar.xz").exists():
        with tarfile.open(archive) as tar:
            return {m.name: io.TextIOWrapper(tar.extractfile(m), errors="replace").read() for m in tar.getmembers()
                    if m.isfile() and m.name.endswith(".log")}
    return None


def _waits(outdir: Path, packed_span_s, packed) -> dict | None:
    logs = _logs(outdir)
    if logs is None:
        return None
    waited: dict[str, list[int]] = {}
    starts = []
    for text in logs.values():
        for seconds, what in WAITED.findall(text):
            waited.setdefault(what.strip(), []).append(int(seconds))
        began = re.search(VLLM_TIME.format("api_utils.py:\\d+\\] non-default"), text)
        ended = re.search(VLLM_TIME.format("core.py:\\d+\\] init engine"), text)
        if began and ended:  # vLLM's clock has no year; the span of one start never crosses one
            at = lambda m: datetime.datetime.strptime(m.group(1), "%m-%d %H:%M:%S")  # noqa: E731
            starts.append((at(began), at(ended)))
    result = {"waited": {what: {"jobs": len(s), "total_s": sum(s)} for what, s in sorted(waited.items())},
              "engine_starts": len(starts), "engine_start_s": sum((b - a).total_seconds() for a, b in starts)}
    if packed and starts:
        # The packed span on vLLM's clock: the statistics hold epoch seconds, vLLM logs the machine's time (UTC)
        clock = lambda t: datetime.datetime.fromtimestamp(t, datetime.timezone.utc).replace(tzinfo=None, year=1900)  # noqa: E731
        first = clock(min(r["train_started_at"] - (r.get("startup_s") or 0.0) for r in packed))
        last = clock(max(r["train_finished_at"] for r in packed))
        busy, until = 0.0, None
        for a, b in sorted(starts):
            a, b = max(a, first), min(b, last)
            if b <= a:
                continue
            if until is not None and a < until:
                a = until
            if b > a:
                busy += (b - a).total_seconds()
                until = b
        result["engine_starting_share_of_packed_span"] = busy / packed_span_s
    return result


if __name__ == "__main__":
    main()
