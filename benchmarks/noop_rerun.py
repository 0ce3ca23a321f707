"""Snakemake's overhead when nothing is to be done: the tiny study run once, then rerun unchanged.

    python benchmarks/noop_rerun.py [RUNS]      (default 5; prints each time and the median)

The time is the whole `snakemake results/tiny/grpo_equivalence.md ...` invocation (interpreter start, DAG,
config checks, code hashes, metadata), which answers "Nothing to be done".
"""

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CMD = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "results/tiny/grpo_equivalence.md", "--cores",
       "2", "--config", f"study={ROOT / 'studies' / 'tiny.yaml'}"]


def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([*CMD, "--directory", work, "-q"], check=True, capture_output=True)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            out = subprocess.run([*CMD, "--directory", work], check=True, capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            assert "Nothing to be done" in out.stdout + out.stderr, out.stdout + out.stderr
        print("no-op reruns (s): " + ", ".join(f"{t:.2f}" for t in times))
        print(f"median of {runs}: {statistics.median(times):.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
