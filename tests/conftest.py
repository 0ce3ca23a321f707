import copy
import os
from pathlib import Path

import pytest
import yaml

# Nothing is ever fetched from a hub: every model and data set here is built by the project.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The test workers share the machine's cores with each other's jobs: an OpenMP thread that spins while it waits for
# work (the default policy) holds a core another process needs; the tiny study's two-thread priming then takes twice
# its CPU time.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The CPU threads a test that trains or samples in its own process may use: the machine's cores shared among the
# workers that run at once (threads beyond a core each would only wait on one another).
THREADS = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))

ROOT = Path(__file__).resolve().parents[1]


# The order modules start in when several run at a time (make test: pytest -n 3 --dist loadfile --no-loadscope-reorder,
# the first modules one to each worker, then the next module to whichever finishes): the longest first, so that the
# workers finish together; while the first builds the primed tiny model and the tiny study's run that most whole-
# workflow tests share, the others run modules that need neither.
LONGEST_FIRST = ("test_workflow", "test_docs", "test_bad_inputs", "test_slurm", "test_rollout", "test_power",
                 "test_reliability",
                 "test_reruns", "test_packing", "test_train", "test_native", "test_outside", "test_random_model",
                 "test_gpus")


# Fixtures that need the primed tiny model, a workflow run of about 40 s on two cores: a test that asks for one is
# slow, outside the quick tier (make test-quick), whatever its own time.
NEEDS_PRIMING = {"primed", "tiny_results", "tiny_into", "tiny_run"}


def pytest_collection_modifyitems(config, items):
    import torch

    torch.set_num_threads(THREADS)
    for item in items:
        if NEEDS_PRIMING & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)

    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a module's tests keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def tiny_yaml() -> dict:
    """studies/tiny.yaml, writing its outputs to results/ (where the tests look) rather than to results/tiny/."""
    return {**yaml.safe_load((ROOT / "studies" / "tiny.yaml").read_text()), "results": "results"}


@pytest.fixture(scope="session")
def tiny_study() -> dict:
    return tiny_yaml()


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

    def build(folder):
        result = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
                                 str(folder), "results/tiny/primed", "--cores", "2", "--config",
                                 f"study={ROOT / 'studies' / 'tiny.yaml'}"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-3000:]

    return shared_once(tmp_path_factory, "tiny-results", build) / "results" / "tiny"


def shared_once(tmp_path_factory, name: str, build) -> Path:
    """A folder built once for the whole test run, however many workers run it: the first worker to need it calls
    build(folder) while the others wait on its lock, then each finds it built."""
    from filelock import FileLock

    # Under pytest-xdist each worker's temporary folder is in the run's common one
    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (folder / ".built").exists():
            folder.mkdir(exist_ok=True)
            build(folder)
            (folder / ".built").touch()
    return folder


# The tiny study as the whole-workflow tests run it: two short step counts, three seeds of each backend (the first
# planned look), every backend's rollout check at the tiny study's own size.
TINY_RUN = {"steps": [4, 6], "replicates": {"reference": 3, "others": 3}}


def tiny_run_config() -> dict:
    config = tiny_yaml()
    config.update(copy.deepcopy(TINY_RUN))
    return config


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_results):
    """The tiny study (TINY_RUN) run once by the workflow, for every test that reads a whole study: each copies it
    (copy_run) and works on its copy."""
    import subprocess
    import sys

    def build(folder):
        copy_tiny(tiny_results, folder)  # primed once for the session, by this workflow's own rules
        (folder / "study.yaml").write_text(yaml.safe_dump(tiny_run_config()))
        result = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
                                 str(folder), "results/grpo_equivalence.md", "--cores", "2", "--config",
                                 f"study={folder / 'study.yaml'}"], capture_output=True, text=True)
        assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"

    return shared_once(tmp_path_factory, "tiny-run", build)


def copy_run(run: Path, workdir: Path) -> None:
    """A study run's outputs, its study file and Snakemake's records of them into `workdir` (cp -a keeps the files'
    times): Snakemake there finds everything up to date."""
    import subprocess

    workdir.mkdir(parents=True, exist_ok=True)
    for kept in ("results", ".snakemake", "study.yaml"):
        subprocess.run(["cp", "-a", str(run / kept), str(workdir / kept)], check=True)
    for lock in (workdir / ".snakemake" / "locks").glob("*"):
        lock.unlink()


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
