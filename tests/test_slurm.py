"""The tiny study through the SLURM profile on a real single-node SLURM (started by .ci/slurm.sh).

Skipped where no SLURM answers. The cluster has four dummy GPUs (gres backed by empty files), so a
train job's `--gpus=1` is scheduled for real while the job itself trains on the CPU:
GRPO_EQUIVALENCE_TRAIN_DEVICE=cpu says so, for this test cluster only.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, copy_tiny, tiny_yaml
from helpers import SMALL_ROLLOUT_CHECK

pytestmark = pytest.mark.workflow
STEPS = (4,)
REPLICATES = {"reference": 1, "others": 1}  # one run each (2 is refused: it reaches no look); 2 train jobs


def slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    result = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    return result.returncode == 0 and bool(re.search(r"idle|mixed|allocated", result.stdout))


# CI starts SLURM and sets GRPO_EQUIVALENCE_REQUIRE_SLURM, so that a cluster that failed to come up
# fails these tests instead of skipping them.
requires_slurm = pytest.mark.skipif(not slurm_up() and not os.environ.get("GRPO_EQUIVALENCE_REQUIRE_SLURM"),
                                    reason="no SLURM answers here (start one with .ci/slurm.sh start)")


def run_through_slurm(workdir: Path, *extra) -> subprocess.CompletedProcess:
    env = dict(os.environ, GRPO_EQUIVALENCE_TRAIN_DEVICE="cpu")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "results/grpo_equivalence.md",
           "--directory", str(workdir), "--profile", str(ROOT / "profiles" / "slurm"),
           # This test cluster has no accounting database (sacct fails) and no account to charge.
           "--slurm-status-command", "squeue", "--slurm-no-account", "--slurm-init-seconds-before-status-checks", "2",
           "--slurm-keep-successful-logs",
           # The profile's train jobs ask for a GPU node's memory; this machine has 24 GB in all.
           "--set-resources", "train:mem_mb=2000", "train:cpus_per_gpu=1",
           "--config", f"study={workdir / 'study.yaml'}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def cluster_study(tmp_path_factory, tiny_results):
    workdir = tmp_path_factory.mktemp("slurm")
    copy_tiny(tiny_results, workdir)  # primed once
    config = tiny_yaml()
    config.update(backends=["hf", "cb_paged"], steps=list(STEPS), gpus_per_train_job=1, replicates=REPLICATES,
                  rollout_check=SMALL_ROLLOUT_CHECK)
    (workdir / "study.yaml").write_text(yaml.safe_dump(config))
    result = run_through_slurm(workdir)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    return workdir, result.stdout + result.stderr


@requires_slurm
def test_train_jobs_went_through_sbatch_with_the_configs_gpu_request(cluster_study):
    workdir, output = cluster_study
    for backend in ("hf", "cb_paged"):
        for steps in STEPS:
            run = json.loads((workdir / f"results/stats/grpo_{backend}_{steps}.json").read_text())
            lease = run["environment"]["gpu_lease"]
            assert lease["source"] == "slurm"  # SLURM assigned the device; the lease stepped aside
    # One sbatch job per train job (its log is named by SLURM's job id), each asking for the config's GPU.
    logs = list((workdir / ".snakemake" / "slurm_logs" / "rule_train").rglob("*.log"))
    assert len(logs) == 2 * len(STEPS)
    for log in logs:
        job = subprocess.run(["scontrol", "show", "job", log.stem], capture_output=True, text=True, check=True).stdout
        assert "Comment=rule_train_wildcards_" in job
        assert re.search(r"TresPerJob=gres:gpu:1\b", job), job
    # the jobs that only read statistics ran beside Snakemake (localrules), never queued
    submitted = {path.name for path in (workdir / ".snakemake" / "slurm_logs").iterdir()}
    assert {"rule_train", "rule_rollout_check", "rule_trainer_check"} <= submitted and not submitted & {
        "rule_summarise", "rule_compare", "rule_plot_curves", "rule_plot_speed", "rule_render_report",
        "rule_trainer_compare"}, submitted


def table_structure(report: str) -> list[tuple[str, int]]:
    """Headings, and each table row's first cell and width: the report's shape without its numbers."""
    shape = []
    for line in report.splitlines():
        if line.startswith("#"):
            shape.append((line, 0))
        elif line.startswith("| "):
            cells = line.strip("|").split("|")
            shape.append((cells[0].strip(), len(cells)))
    return shape


@requires_slurm
def test_report_has_the_same_tables_as_a_local_run(cluster_study):
    from grpo_equivalence.report.render import from_stats_dir
    from grpo_equivalence.report.sections import rollout_from_dir, trainer_from_dir

    workdir, _ = cluster_study
    report = (workdir / "results" / "grpo_equivalence.md").read_text()
    # the same runs, rollout checks and trainer checks, reported on this machine
    local = from_stats_dir(workdir / "results" / "stats", "hf", rollout=rollout_from_dir(workdir / "results" / "rollout", "hf"),
                           trainer=trainer_from_dir(workdir / "results" / "trainer"))
    assert table_structure(report) == table_structure(local)
    assert [h for h, _ in table_structure(report) if h.startswith("## ")] == [
        "## The answer", "## How to read it", "## Rollout check at fixed weights", "## Trainer check at fixed weights"] + [f"## {s} steps" for s in STEPS] + ["## Warnings the runs raised", "## Study settings", "## Raw statistics"]
    for steps in STEPS:
        assert f"results/stats/grpo_cb_paged_{steps}.json" in report


@requires_slurm
def test_rerun_submits_nothing(cluster_study):
    workdir, _ = cluster_study
    result = run_through_slurm(workdir)
    assert result.returncode == 0
    assert "Nothing to be done" in result.stdout + result.stderr
    assert "Submitted" not in result.stdout + result.stderr
