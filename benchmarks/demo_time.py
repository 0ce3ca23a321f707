"""Wall time of the README's main command (`make demo`) on a fresh clone, several times; prints the median.

Each run clones the repository's HEAD into a new folder and runs `make demo` there, so the time includes
creating the environment, installing, building and priming the tiny model and the whole workflow. The
Snakemake part alone (the study, without the install) is timed too.

    python benchmarks/demo_time.py [RUNS]      (default 3)
"""

import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run() -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        start = time.perf_counter()
        result = subprocess.run(["make", "demo"], cwd=clone, capture_output=True, text=True)
        total = time.perf_counter() - start
        if result.returncode != 0:
            sys.exit(f"make demo failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        h, m, s = re.search(r"Elapsed time: (\d+):(\d+):([\d.]+)", result.stdout + result.stderr).groups()
        return total, int(h) * 3600 + int(m) * 60 + float(s)


def main(runs: int) -> None:
    totals, studies = [], []
    for i in range(runs):
        total, study = one_run()
        totals.append(total)
        studies.append(study)
        print(f"run {i + 1}: make demo {total:.1f} s (of which the workflow {study:.1f} s)", flush=True)
    print(f"median of {runs}: make demo {statistics.median(totals):.1f} s, workflow {statistics.median(studies):.1f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
