"""Makespan of GPU train jobs under the workflow's scheduling, against the lower bound.

Fake train jobs of known durations (sleeps) run through Snakemake on N fake GPUs, each job holding its
GPU through the workflow's lease (grpo_equivalence.runtime.gpus) and ordered by the workflow's priority
(grpo_equivalence.study.schedule, fed with earlier "measurements" written as statistics files). Prints, per N,
the makespan with the priority and without it (Snakemake's own order), the lower bound
max(longest job, total / N), and whether any two jobs ever shared a device.

    python benchmarks/scheduling.py [SCALE] [REPEATS]   (SCALE multiplies every duration; defaults 1 and 3)

Figures are medians over REPEATS runs of each setting.
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from grpo_equivalence.analysis import stats  # noqa: E402

STEP_S = {"fast": 0.05, "mid": 0.1, "slow": 0.3}  # seconds a step, as if measured in an earlier run
STEPS = (10, 30)

SNAKEFILE = """
import sys
sys.path.insert(0, {src!r})
from grpo_equivalence.study import schedule

DURATION = {durations!r}

rule all:
    input: expand("done/{{job}}", job=DURATION)

rule fake_train:
    output: "done/{{job}}"
    priority: (lambda w: schedule.priority(w.job.rsplit("_", 1)[0], int(w.job.rsplit("_", 1)[1]))) if {use_priority} else 0
    resources: gpu=1
    params: seconds=lambda wildcards: DURATION[wildcards.job]
    shell:
        "{python} -m grpo_equivalence.runtime.gpus 1 -- {python} -c "
        "'import os, sys, time; t = time.time(); time.sleep({{params.seconds}}); "
        "print(os.environ[\\"CUDA_VISIBLE_DEVICES\\"], t, time.time())' > {{output}}"
"""


def run(n_gpus: int, use_priority: bool, scale: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        durations = {f"{b}_{s}": round(STEP_S[b] * s * scale, 3) for b in STEP_S for s in STEPS}
        for backend, step_s in STEP_S.items():  # the earlier run the priority reads
            run_stats = {"schema_version": 1, "backend": backend, "max_steps": 10, "seed": 0, "model": "m", "dataset": "d",
                         "train_wall_s": 10 * step_s * scale, "peak_mem_gb": None, "effective_config": {}, "environment": {},
                         "steps": [{"step": i, "wall_s": step_s * scale, "loss": None, "grad_norm": None, "reward": None,
                                    "kl": None, "peak_mem_gb": None, "metrics": {}} for i in range(1, 11)]}
            stats.write(work / "results" / "stats" / f"grpo_{backend}_10.json", run_stats)
        (work / "Snakefile").write_text(SNAKEFILE.format(src=str(ROOT / "src"), durations=durations,
                                                         use_priority=use_priority, python=sys.executable))
        env = {"GRPO_EQUIVALENCE_GPUS": ",".join(map(str, range(n_gpus))),
               "GRPO_EQUIVALENCE_GPU_LOCKS": str(work / "locks"), "PATH": "/usr/bin:/bin"}
        start = time.time()
        subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(n_gpus), "--resources", f"gpu={n_gpus}", "-q"],
                       cwd=work, env=env, check=True, capture_output=True)
        wall = time.time() - start
        held = [line.split() for f in (work / "done").iterdir() for line in f.read_text().splitlines()]
        intervals = [(d, float(s), float(e)) for d, s, e in held]
        shared = any(a[0] == b[0] and a[1] < b[2] and b[1] < a[2] for i, a in enumerate(intervals) for b in intervals[i + 1:])
        first, last = min(s for _, s, _ in intervals), max(e for _, _, e in intervals)
        total = sum(durations.values())
        return {"gpus": n_gpus, "priority": use_priority, "makespan_s": last - first, "snakemake_wall_s": wall,
                "lower_bound_s": max(max(durations.values()), total / n_gpus), "shared_a_device": shared}


def main(scale: float, repeats: int) -> None:
    import statistics

    for n_gpus in (2, 4):
        for use_priority in (True, False):
            runs = [run(n_gpus, use_priority, scale) for _ in range(repeats)]
            makespan = statistics.median(r["makespan_s"] for r in runs)
            bound = runs[0]["lower_bound_s"]
            print(f"{n_gpus} GPUs, priority {'on ' if use_priority else 'off'}: median makespan {makespan:.2f} s "
                  f"(lower bound {bound:.2f} s, ratio {makespan / bound:.2f}); median Snakemake wall "
                  f"{statistics.median(r['snakemake_wall_s'] for r in runs):.1f} s; two jobs on one device in any run: "
                  f"{any(r['shared_a_device'] for r in runs)}", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0, int(sys.argv[2]) if len(sys.argv) > 2 else 3)
