import copy
import os
from pathlib import Path

import pytest
import yaml

# Nothing is ever fetched from a hub: every model and data set here is built by the project.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


# The modules that take longest (each runs a workflow of its own), started first: run in parallel (make test,
# pytest -n 2 --dist loadfile), the workers then finish together rather than one waiting on the last long module.
LONGEST_FIRST = ("test_workflow", "test_slurm", "test_reliability", "test_rollout", "test_packing", "test_reruns",
                 "test_outside", "test_native", "test_train")


def pytest_collection_modifyitems(config, items):
    import torch

    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a module's tests keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_study() -> dict:
    return yaml.safe_load((ROOT / "studies" / "tiny.yaml").read_text())


@pytest.fixture
def tiny_config(tiny_study) -> dict:
    return copy.deepcopy(tiny_study)


@pytest.fixture(scope="session")
def tiny_results(tmp_path_factory, worker_id):
    """results/tiny of the tiny study (model, data and the primed model), built once by the workflow itself: a
    whole-workflow test that is about something else copies it in (tiny_into) instead of priming again. cp -a keeps
    the files' times, so Snakemake finds them up to date. Tests run in parallel share it: the first worker to need
    it builds it under the run's common folder while the others wait on its lock."""
    import subprocess
    import sys

    from filelock import FileLock

    root = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    workdir = root / "tiny-results"
    with FileLock(str(root / "tiny-results.lock")):
        if not (workdir / "built").exists():
            workdir.mkdir(exist_ok=True)
            result = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
                                     str(workdir), "results/tiny/primed", "--cores", "2", "--config",
                                     f"study={ROOT / 'studies' / 'tiny.yaml'}"], capture_output=True, text=True)
            assert result.returncode == 0, result.stderr[-3000:]
            (workdir / "built").touch()
    return workdir / "results" / "tiny"


@pytest.fixture(scope="session")
def primed(tiny_results, tmp_path_factory):
    """The workflow's primed tiny model and its data file (a copy of tiny_results', for tests that train directly)."""
    import shutil

    root = tmp_path_factory.mktemp("tiny")
    shutil.copytree(tiny_results / "primed", root / "primed")
    shutil.copy(tiny_results / "data" / "train.jsonl", root / "train.jsonl")
    return {"model": str(root / "primed"), "dataset": {"path": "json", "data_files": str(root / "train.jsonl")}}


def copy_tiny(tiny_results: Path, workdir: Path) -> None:
    """The built tiny study's results/tiny in `workdir`, with the logs of the jobs that built them and Snakemake's
    records of them (a study with tiny.yaml's tiny section): Snakemake there finds them up to date, as it would have
    built them, also in a fresh clone."""
    import subprocess

    (workdir / "results" / "logs").mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(tiny_results), str(workdir / "results" / "tiny")], check=True)
    for log in (tiny_results.parent / "logs").glob("*.log"):  # the logs of the jobs that built them (prime.log ...)
        subprocess.run(["cp", "-a", str(log), str(workdir / "results" / "logs" / log.name)], check=True)
    records = workdir / ".snakemake" / "metadata"
    records.mkdir(parents=True, exist_ok=True)
    for record in (tiny_results.parents[1] / ".snakemake" / "metadata").iterdir():
        subprocess.run(["cp", "-a", str(record), str(records / record.name)], check=True)


@pytest.fixture
def tiny_into(tiny_results):
    """tiny_into(workdir): copy_tiny into `workdir`."""
    return lambda workdir: copy_tiny(tiny_results, workdir)
