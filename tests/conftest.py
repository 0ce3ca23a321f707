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


def pytest_collection_modifyitems(config, items):
    import torch

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
def tiny_results(tmp_path_factory):
    """results/tiny of the tiny study (model, data and the primed model), built once by the workflow itself: a
    whole-workflow test that is about something else copies it in (tiny_into) instead of priming again. cp -a keeps
    the files' times, so Snakemake finds them up to date."""
    import subprocess
    import sys

    workdir = tmp_path_factory.mktemp("tiny-results")
    result = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
                             "results/tiny/primed", "--cores", "2", "--config", f"study={ROOT / 'studies' / 'tiny.yaml'}"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
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
    """The built tiny study's results/tiny in `workdir`, with Snakemake's records of them (a study with tiny.yaml's
    tiny section): Snakemake there finds them up to date, as it would have built them, also in a fresh clone."""
    import subprocess

    (workdir / "results").mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(tiny_results), str(workdir / "results" / "tiny")], check=True)
    records = workdir / ".snakemake" / "metadata"
    records.mkdir(parents=True, exist_ok=True)
    for record in (tiny_results.parents[1] / ".snakemake" / "metadata").iterdir():
        subprocess.run(["cp", "-a", str(record), str(records / record.name)], check=True)


@pytest.fixture
def tiny_into(tiny_results):
    """tiny_into(workdir): copy_tiny into `workdir`."""
    return lambda workdir: copy_tiny(tiny_results, workdir)
