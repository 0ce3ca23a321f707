"""The whole workflow through Snakemake on the tiny study: real jobs, then the report checked against the
statistics files it was made from, and Snakemake's own plan for a rerun."""

import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from helpers import tables_headed

pytestmark = pytest.mark.workflow
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile")]
STEPS = (4, 6)


def snakemake(workdir: Path, *args: str, check=True) -> subprocess.CompletedProcess:
    """The tiny study with two short step counts, in `workdir` (its config is written there)."""
    config = yaml.safe_load((ROOT / "studies" / "tiny.yaml").read_text())
    config["steps"] = list(STEPS)
    (workdir / "study.yaml").write_text(yaml.safe_dump(config))
    cmd = [*SNAKEMAKE, "--directory", str(workdir), "results/grpo_equivalence.md", "--cores", "2",
           "--config", f"study={workdir / 'study.yaml'}", *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("study")
    snakemake(workdir)
    return workdir


def load(workdir, backend, steps):
    return json.loads((workdir / f"results/stats/grpo_{backend}_{steps}.json").read_text())


def test_every_job_ran_and_logged(study):
    for backend in ("hf", "cb_paged"):
        for steps in STEPS:
            run = load(study, backend, steps)
            assert [s["step"] for s in run["steps"]] == list(range(1, steps + 1))
            assert (study / f"results/logs/train/{backend}_{steps}.log").read_text().strip()
    assert (study / "results/tiny/primed/config.json").exists()
    assert "prime step" in (study / "results/logs/prime.log").read_text()


def test_each_backend_trained_with_its_own_options(study):
    tiny = yaml.safe_load((ROOT / "studies" / "tiny.yaml").read_text())
    trainer = load(study, "cb_paged", STEPS[0])["effective_config"]["trainer"]
    assert trainer["use_transformers_continuous_batching"] is True
    assert trainer["transformers_continuous_batching_config"] == tiny["backend_options"]["cb_paged"]["continuous_batching"]


def test_report_speed_tables_match_the_statistics(study):
    report = (study / "results/grpo_equivalence.md").read_text()
    assert re.findall(r"^## (\d+) steps$", report, re.M) == [str(s) for s in STEPS]
    speed_tables = tables_headed(report, "Backend", "Train wall (s)")
    for table, steps in zip(speed_tables, STEPS, strict=True):
        ref_median = statistics.median(s["wall_s"] for s in load(study, "hf", steps)["steps"] if s["step"] > 3)
        rows = {row["Backend"]: row for row in table}
        for backend in ("hf", "cb_paged"):
            run = load(study, backend, steps)
            median = statistics.median(s["wall_s"] for s in run["steps"] if s["step"] > 3)
            row = rows[backend]
            assert row["Train wall (s)"] == f"{run['train_wall_s']:.1f}"
            assert row["Median step (s)"] == f"{median:.3f}"
            assert row["Peak mem (GB)"] == f"{run['peak_mem_gb']:.2f}"
            assert row["% of hf"] == f"{100 * ref_median / median:.0f} %"
            assert row["Start-up (s)"] == f"{run['startup_s']:.1f}" and 0 < run["startup_s"] < run["train_wall_s"] * 10


def test_report_differences_match_the_statistics(study):
    report = (study / "results/grpo_equivalence.md").read_text()
    pairs = [table[0] for table in tables_headed(report, "Candidate")]
    assert len(pairs) == len(STEPS)
    for row, steps in zip(pairs, STEPS):
        row = list(row.values())
        ref, cand = load(study, "hf", steps)["steps"], load(study, "cb_paged", steps)["steps"]
        diff = {m: [abs(c[m] - r[m]) for c, r in zip(cand, ref)] for m in ("loss", "reward", "kl", "grad_norm")}
        assert all(math.isfinite(d) for d in diff["kl"])  # beta != 0: kl logged by both backends
        assert float(row[1]) == pytest.approx(max(diff["loss"]), abs=1e-4)
        reward_max, reward_mean = re.match(r"(\S+) \((\S+)\)", row[2]).groups()
        assert float(reward_max) == pytest.approx(max(diff["reward"]), abs=1e-3)
        assert float(reward_mean) == pytest.approx(statistics.mean(diff["reward"]), abs=1e-3)
        assert float(row[3]) == pytest.approx(max(diff["kl"]), rel=1e-3, abs=1e-4)
        assert float(row[4]) == pytest.approx(max(diff["grad_norm"]), abs=1e-4)


def test_grpo_has_a_signal(study):
    """Primed, the tiny model's rewards vary within groups on most steps, or the comparison is empty."""
    for backend in ("hf", "cb_paged"):
        fractions = [s["metrics"]["frac_reward_zero_std"] for s in load(study, backend, max(STEPS))["steps"]]
        assert sum(f < 1 for f in fractions) > len(fractions) / 2, (backend, fractions)


def test_rerun_with_nothing_changed_runs_nothing(study):
    result = snakemake(study, "--dry-run")
    assert "Nothing to be done" in result.stdout + result.stderr


def test_grpo_report_cli_renders_the_same_tables(study):
    out = study / "cli_report.md"
    subprocess.run([sys.executable, "-c", "from grpo_equivalence.cli import report_main; report_main()",
                    "--stats-dir", str(study / "results/stats"), "--reference", "hf", "-o", str(out)], check=True)
    workflow_report = (study / "results/grpo_equivalence.md").read_text()
    cli_report = out.read_text()
    table = re.compile(r"^\| (hf|cb_paged) .*$", re.M)
    assert table.findall(cli_report) and [m.group(0) for m in table.finditer(cli_report)] == \
        [m.group(0) for m in table.finditer(workflow_report)]


def test_lint_is_clean():
    result = subprocess.run([*SNAKEMAKE, "--lint", "--configfile", str(ROOT / "studies" / "tiny.yaml")],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_bad_config_stops_before_any_job(tmp_path):
    result = subprocess.run([*SNAKEMAKE, "--directory", str(tmp_path), "--cores", "1", "--configfile",
                             str(ROOT / "studies" / "tiny.yaml"), "--config", "reference=vllm"],
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "reference: 'vllm' is not among backends ['hf', 'cb_paged']" in result.stdout + result.stderr
    assert not (tmp_path / "results").exists()


def test_the_study_plans_on_a_machine_without_gpu(tmp_path):
    """The default config.yaml (the GPU study) plans its DAG anywhere, e.g. on a login node."""
    result = subprocess.run([*SNAKEMAKE, "--directory", str(tmp_path), "--dry-run", "--cores", "1"],  # config.yaml: the default
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for backend in ("vllm", "unsloth_fi_false", "cb_paged"):
        for steps in (10, 30):
            assert f"results/stats/grpo_{backend}_{steps}.json" in out
    assert "prime" not in re.findall(r"^rule (\w+):", out, re.M)


def unrunnable_study(workdir: Path) -> Path:
    config = yaml.safe_load((ROOT / "studies" / "tiny.yaml").read_text())
    config["backends"] = ["hf", "unsloth_fi_false"]  # needs CUDA and Unsloth: neither is here
    path = workdir / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_backend_that_cannot_run_here_stops_the_workflow_before_any_job(tmp_path):
    result = subprocess.run([*SNAKEMAKE, "results/grpo_equivalence.md", "--directory", str(tmp_path), "--cores", "2",
                             "--configfile", str(unrunnable_study(tmp_path))], capture_output=True, text=True)
    assert result.returncode != 0
    assert "backend 'unsloth_fi_false' cannot run here" in result.stdout + result.stderr
    assert not (tmp_path / "results" / "logs").exists()  # no job started


def test_backend_that_cannot_run_fails_its_job_before_loading_the_model(tmp_path):
    """On a cluster the planning machine does not check (--no-hooks stands in): the job itself stops."""
    result = subprocess.run([*SNAKEMAKE, "results/stats/grpo_unsloth_fi_false_6.json", "--directory", str(tmp_path),
                             "--cores", "2", "--no-hooks", "--configfile", str(unrunnable_study(tmp_path))],
                            capture_output=True, text=True)
    assert result.returncode != 0
    log = (tmp_path / "results/logs/train/unsloth_fi_false_6.log").read_text()
    assert "backend 'unsloth_fi_false' cannot run here" in log
    assert "loading" not in log  # stopped before the model load
    assert not (tmp_path / "results/stats/grpo_unsloth_fi_false_6.json").exists()
