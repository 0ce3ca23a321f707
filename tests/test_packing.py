"""Several runs on one GPU (gpu_sharing): what each job asks for, a packed study through the workflow, and the
studies that must keep a GPU per job.

The packed study trains on the CPU (GRPO_EQUIVALENCE_TRAIN_DEVICE=cpu) while its jobs lease a configured device
list of one 10 GB GPU: the lease, the DAG and the report are the real ones, only the device is a stand-in.
"""

import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, tiny_yaml
from grpo_equivalence.analysis import stats
from grpo_equivalence.runtime import gpus, leasefolder, quietlock
from grpo_equivalence.study import gpushare
from grpo_equivalence.study.config import ConfigError, load_study
from grpo_equivalence.study.validate import check
from grpo_equivalence.training import session
from helpers import SMALL_ROLLOUT_CHECK, make_stats


def dry_run_resources(study: str) -> dict[str, str]:
    """The `gpu` resource of every train job Snakemake plans for `study` (a dry run)."""
    result = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-n",
                             "--resources", "gpu=4", "--config", f"study={study}"],  # the study's report, by default
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    found, rule = {}, None
    for line in result.stdout.splitlines():
        if line.startswith("rule "):
            rule = line.split()[1].rstrip(":")
        elif rule == "train" and line.strip().startswith("output:"):
            output = line.split(":", 1)[1].strip()
        elif rule == "train" and line.strip().startswith("resources:"):
            found[output] = line.split("gpu=")[1].split(",")[0]
    return found


@pytest.mark.parametrize("study", ["config.yaml", "studies/speed-4b.yaml"])
def test_a_4b_study_still_gets_one_job_per_gpu(study):
    config = load_study(ROOT / study)
    assert not gpushare.packs(config)
    for backend in config["backends"]:
        for alone in (True, False):
            assert gpushare.need(config, backend, run="r", alone=alone).whole
    resources = dry_run_resources(study)
    assert resources and set(resources.values()) == {"1"}  # Snakemake counts a GPU for every train job


def tiny_packed(**sharing) -> dict:
    config = tiny_yaml()
    config.update(trainer_check=False)  # its jobs lease through the same gpu_io as the rollout check's
    config.update(gpus_per_train_job=1, gpu_sharing={"jobs_per_gpu": 4, "memory_gb": None, "speed_runs": "first",
                                                      **sharing})
    return config


def test_a_packed_job_asks_for_what_its_backend_measured_and_a_vllm_backend_for_its_share_too(tmp_path):
    config = tiny_packed()
    config["backend_options"]["vllm"] = {"gpu_memory_utilization": 0.05}
    assert gpushare.need(config, "hf", run="r", alone=True).whole  # the speed run
    assert gpushare.need(config, "hf", run="r", alone=False, folder=tmp_path).whole  # nothing measured yet
    run = make_stats("hf", 4)
    run["environment"]["gpu_lease"] = {"source": "lease", "shared_with": []}
    stats.write(tmp_path / "grpo_hf_4.json", run)  # its steps' peaks: 1.01 .. 1.04 GB
    stats.write(tmp_path / "grpo_hf_static_4.json", make_stats("hf_static", 4, peak=50.0))  # not hf's
    packed = gpushare.need(config, "hf", run="r", alone=False, folder=tmp_path)
    assert not packed.whole and packed.memory_gb == pytest.approx(1.04 * gpushare.MARGIN) and packed.jobs_per_gpu == 4
    vllm = make_stats("vllm", 4, peak=9.0)  # 7.5 GB of it is the engine's reservation
    vllm["environment"].update(gpu_lease={"source": "lease", "shared_with": []}, gpu_memory_gb=150.0)
    vllm["effective_config"]["trainer"].update(use_vllm=True, vllm_gpu_memory_utilization=0.05)
    stats.write(tmp_path / "grpo_vllm_4.json", vllm)
    asked = gpushare.need(config, "vllm", run="r", alone=False, folder=tmp_path)
    assert asked.memory_share == 0.05 and asked.memory_gb == pytest.approx((9.04 - 7.5) * gpushare.MARGIN)
    assert asked.gb(150.0) == pytest.approx(7.5 + (9.04 - 7.5) * gpushare.MARGIN)
    fixed = gpushare.need(tiny_packed(memory_gb=3.0), "hf", run="r", alone=False, folder=tmp_path)
    assert fixed.memory_gb == 3.0  # the study's setting over the measurement


def test_a_packed_job_compiles_with_its_own_cores_and_an_alone_job_with_the_machines(tmp_path, monkeypatch):
    monkeypatch.setenv(gpus.DEVICES_ENV, "0")
    monkeypatch.setenv(gpus.MEMORY_ENV, "10")
    monkeypatch.setenv(leasefolder.LOCK_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv(quietlock.QUIET_ENV, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(gpushare.COMPILE_THREADS_ENV, raising=False)
    config = tiny_packed(memory_gb=3.0)
    args = {"config": config, "gpu_sharing": config["gpu_sharing"], "backend": "hf", "run": "hf_4_seed3408",
            "threads": 2}
    monkeypatch.setattr(quietlock, "_QUIET_AT_EXIT", [])
    with gpushare.leased_for_job({**args, "alone": True}) as lease:
        assert lease.need.whole and gpushare.COMPILE_THREADS_ENV not in os.environ
        assert os.environ[quietlock.SIZED_ENV] == "1"  # the vLLM engines of a packing study, alone ones too, are sized
    assert quietlock.SIZED_ENV not in os.environ
    monkeypatch.setattr(quietlock, "_QUIET_AT_EXIT", [])
    with gpushare.leased_for_job(args) as lease:
        assert not lease.need.whole and os.environ[gpushare.COMPILE_THREADS_ENV] == "2"
    monkeypatch.setattr(quietlock, "_QUIET_AT_EXIT", [])
    with gpushare.leased_for_job({**args, "config": {**config, "gpu_sharing": None}, "gpu_sharing": None}):
        assert quietlock.SIZED_ENV not in os.environ  # one job per GPU: vLLM sizes its cache as usual
    monkeypatch.setattr(quietlock, "_QUIET_AT_EXIT", [])
    monkeypatch.setenv(gpushare.COMPILE_THREADS_ENV, "8")  # the user's own
    with gpushare.leased_for_job(args):
        assert os.environ[gpushare.COMPILE_THREADS_ENV] == "8"


def test_a_run_that_shared_its_gpu_is_measured_by_its_allocator_not_by_the_devices_figure():
    run = make_stats("hf", 4, peak=40.0)  # the device's figure: the neighbours' memory too
    for step in run["steps"]:
        step["peak_reserved_gb"] = 0.5
    run["environment"]["gpu_lease"] = {"source": "lease", "shared_with": ["hf_4_seed3408"]}
    assert gpushare.own_memory_gb(run) == pytest.approx(0.5 + gpushare.CONTEXT_GB)


def test_a_run_on_several_gpus_is_refused_before_any_job_for_the_backends_that_train_on_one_process(tiny_config,
                                                                                                       tmp_path):
    tiny_config.update(gpus_per_train_job=2, backends=["hf", "vllm", "trl_vllm"], reference="hf")
    with pytest.raises(ConfigError) as error:
        check(tiny_config)
    assert "gpus_per_train_job: 2 trains each run on 2 processes (data parallel), which vllm, trl_vllm cannot yet" \
        in str(error.value)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(tiny_config))
    result = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
                             str(tmp_path), "results/grpo_equivalence.md", "--cores", "1", "--config", f"study={path}"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "which vllm, trl_vllm cannot yet" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "results").exists()
    tiny_config["backends"] = ["hf", "hf_static", "cb_paged", "native"]
    check(tiny_config)


@pytest.mark.workflow
def test_a_run_on_two_gpus_trains_on_two_processes(tmp_path, tiny_into):
    """gpus_per_train_job: 2 leases two devices (stand-ins) and trains the run on two processes over gloo (on the
    CPU), through the workflow: one statistics file, every step, the metrics gathered over both processes."""
    tiny_into(tmp_path)
    config = tiny_yaml()
    config.update(backends=["hf", "native"], reference="hf", steps=[4], gpus_per_train_job=2)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, session.FORCE_CPU_ENV: "cpu", gpus.DEVICES_ENV: "0,1", leasefolder.LOCK_DIR_ENV: str(tmp_path / "locks")}
    env.pop("SLURM_JOB_ID", None)
    result = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
                             str(tmp_path), "results/stats/grpo_hf_4.json", "results/stats/grpo_native_4.json",
                             "--cores", "4", "--resources", "gpu=2", "--config", f"study={tmp_path / 'study.yaml'}"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    for backend in ("hf", "native"):
        run = stats.load(tmp_path / f"results/stats/grpo_{backend}_4.json")
        assert run["environment"]["processes"] == 2 and run["environment"]["gpu_lease"]["devices"] == ["0", "1"]
        assert [s["step"] for s in run["steps"]] == [1, 2, 3, 4] and all(isinstance(s["kl"], float) for s in run["steps"])
        # A step takes a batch of prompts on each process: the epoch advances twice as fast as on one
        prompts_per_process = config["grpo"]["per_device_train_batch_size"] // config["grpo"]["num_generations"]
        assert run["steps"][0]["metrics"]["epoch"] == pytest.approx(2 * prompts_per_process / config["tiny"]["problems"])
        log = (tmp_path / f"results/logs/train/{backend}_4.log").read_text()
        assert "training on 2 processes (data parallel)" in log


def run_packed(workdir, target):
    """Snakemake on the study of `workdir` with one stand-in GPU of 10 GB, training on the CPU."""
    env = {**os.environ, session.FORCE_CPU_ENV: "cpu", gpus.DEVICES_ENV: "0", gpus.MEMORY_ENV: "10",
           leasefolder.LOCK_DIR_ENV: str(workdir / "locks")}
    env.pop("SLURM_JOB_ID", None)
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
                           str(workdir), target, "--cores", "4", "--resources", "gpu=1",
                           "--config", f"study={workdir / 'study.yaml'}"], capture_output=True, text=True, env=env)


@pytest.mark.workflow
def test_a_packed_study_runs_the_speed_run_alone_and_the_other_seeds_together(tmp_path, tiny_into):
    tiny_into(tmp_path)
    config = tiny_packed(jobs_per_gpu=3)
    config.update(backends=["hf"], reference="hf", steps=[4], replicates={"reference": 4, "others": 1},
                  rollout_check=SMALL_ROLLOUT_CHECK)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(config))
    result = run_packed(tmp_path, "results/grpo_equivalence.md")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = {p.name: json.loads(p.read_text()) for p in (tmp_path / "results/stats").glob("grpo_hf_4*.json")
            if not p.name.endswith(".summary.json")}
    speed = runs.pop("grpo_hf_4.json")
    lease = speed["environment"]["gpu_lease"]
    assert lease["whole"] and lease["shared_with"] == []  # the run the report's speed comes from had the GPU alone
    assert len(runs) == 3
    for run in runs.values():
        packed = run["environment"]["gpu_lease"]
        assert not packed["whole"] and packed["jobs_per_gpu"] == 3 and packed["devices"] == ["0"]
        assert run["train_started_at"] >= speed["train_finished_at"]  # it waited for the measurement
    assert any(run["environment"]["gpu_lease"]["shared_with"] for run in runs.values())
    report = (tmp_path / "results/grpo_equivalence.md").read_text()
    assert "Speed and memory come only from runs that had their GPU to themselves (hf x 4 (seed 3407))" in report


def test_speed_runs_last_needs_a_memory_setting(tiny_config):
    tiny_config.update(gpus_per_train_job=1, gpu_sharing={"jobs_per_gpu": 8, "memory_gb": None, "speed_runs": "last"})
    with pytest.raises(ConfigError, match="gpu_sharing.speed_runs: last runs the study's seed after the other seeds"):
        check(tiny_config)
    tiny_config["gpu_sharing"]["memory_gb"] = 2.0
    check(tiny_config)


def test_speed_runs_last_wait_for_every_packed_run_so_that_the_gpu_is_emptied_once(tmp_path):
    config = tiny_packed(jobs_per_gpu=3, memory_gb=2.0, speed_runs="last")
    config.update(backends=["hf", "hf_static"], reference="hf", steps=[4, 5], replicates={"reference": 3, "others": 3})
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
                             str(tmp_path), "-n", "results/stats/grpo_hf_static_4.json", "--resources", "gpu=1",
                             "--config", f"study={tmp_path / 'study.yaml'}"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    planned = {line.split(":", 1)[1].strip() for line in result.stdout.splitlines() if line.strip().startswith("output:")}
    # One backend's speed run waits for the other seeds of every backend and step count, and for no speed run
    assert {f"results/stats/grpo_{b}_{n}_seed{s}.json" for b, seeds in (("hf", (3408, 3409)), ("hf_static", (3408,)))
            for n in (4, 5) for s in seeds} <= planned
    assert {p for p in planned if p.startswith("results/stats/grpo_") and "seed" not in p} == {
        "results/stats/grpo_hf_static_4.json"}


@pytest.mark.workflow
def test_speed_runs_last_run_alone_after_the_other_seeds(tmp_path, tiny_into):
    tiny_into(tmp_path)
    config = tiny_packed(jobs_per_gpu=3, memory_gb=2.0, speed_runs="last")
    config.update(backends=["hf"], reference="hf", steps=[4], replicates={"reference": 3, "others": 1},
                  rollout_check=SMALL_ROLLOUT_CHECK)
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(config))
    result = run_packed(tmp_path, "results/stats/grpo_hf_4.json")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = {p.name: json.loads(p.read_text()) for p in (tmp_path / "results/stats").glob("grpo_hf_4*.json")}
    speed = runs.pop("grpo_hf_4.json")
    assert speed["environment"]["gpu_lease"]["whole"] and speed["environment"]["gpu_lease"]["shared_with"] == []
    assert len(runs) == 2
    for run in runs.values():
        assert run["environment"]["gpu_lease"]["memory_gb"] == {"0": 2.0}  # the study's setting, nothing measured
        assert speed["train_started_at"] >= run["train_finished_at"]
