"""Which train runs overlapped, on which GPUs, and what running them at once saved.

    python benchmarks/gpu_overlap.py STATS_DIR [SNAKEMAKE_LOG]

From the statistics files: each run's leased devices and the wall-clock span of its trainer.train(),
and whether two runs that overlapped in time ever shared a device. From Snakemake's log (optional): each
train job's wall time (start to finish, model loading included), their sum (the time one after another)
against the span of the train phase.
"""

import datetime
import json
import re
import sys
from pathlib import Path


def runs_table(stats_dir: Path) -> None:
    runs = [json.loads(p.read_text()) for p in sorted(stats_dir.glob("grpo_*.json")) if ".summary" not in p.name]
    t0 = min(r["train_started_at"] for r in runs)
    for r in sorted(runs, key=lambda r: r["train_started_at"]):
        lease = r["environment"].get("gpu_lease") or {}
        print(f"{r['backend']:>18} x {r['max_steps']:<3} GPU {','.join(lease.get('devices', [])) or '-':>3}  "
              f"train() {r['train_started_at'] - t0:7.1f} s .. {r['train_finished_at'] - t0:7.1f} s")
    shared = [(a["backend"], a["max_steps"], b["backend"], b["max_steps"]) for i, a in enumerate(runs) for b in runs[i + 1:]
              if set(a["environment"]["gpu_lease"]["devices"]) & set(b["environment"]["gpu_lease"]["devices"])
              and a["train_started_at"] < b["train_finished_at"] and b["train_started_at"] < a["train_finished_at"]]
    print(f"overlapping runs on a shared GPU: {shared or 'none'}")


def job_walls(log: Path) -> None:
    stamp, rule, starts, ends = None, None, {}, {}
    for line in log.read_text().splitlines():
        if m := re.match(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$", line):
            stamp = datetime.datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := re.match(r"^(?:local)?rule (\w+):", line):
            rule = m.group(1)
        elif (m := re.match(r"^\s+jobid: (\d+)", line)) and rule:
            starts[m.group(1)], rule = (rule, stamp), None
        elif m := re.match(r"^Finished jobid: (\d+)", line):
            ends[m.group(1)] = stamp
    train = [(starts[j][1], ends[j]) for j in starts if starts[j][0] == "train" and j in ends]
    total = sum((end - start).total_seconds() for start, end in train)
    span = (max(e for _, e in train) - min(s for s, _ in train)).total_seconds()
    print(f"{len(train)} train jobs: {total:.0f} s one after another (sum of job walls), {span:.0f} s as run "
          f"(span of the train phase): {total / span:.2f}x")


if __name__ == "__main__":
    runs_table(Path(sys.argv[1]))
    if len(sys.argv) > 2:
        job_walls(Path(sys.argv[2]))
