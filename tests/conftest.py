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
def primed(tmp_path_factory, tiny_study):
    """The tiny model, built and primed as the workflow does, and its data file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_equivalence import prime, tiny

    # As the prime job does (threads: 2): a 0.6M-parameter model on every core of a large machine spends its
    # time synchronising threads, and priming that takes seconds here took minutes on a 32-core GPU host.
    torch.set_num_threads(min(4, torch.get_num_threads()))
    root = tmp_path_factory.mktemp("tiny")
    t = tiny_study["tiny"]
    tiny.save_model(root / "model", hidden_size=t["hidden_size"], num_layers=t["num_layers"], seed=t["seed"])
    rows = tiny.problems(t["problems"], t["max_operand"], t["seed"])
    tiny.save_problems(root / "train.jsonl", rows)
    model = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(root / "model")
    prime.prime(model, tokenizer, rows, system_prompt=tiny_study["system_prompt"], steps=t["prime_steps"],
                batch_size=t["prime_batch_size"], learning_rate=t["prime_learning_rate"], seed=t["seed"], log=lambda s: None)
    model.save_pretrained(root / "primed")
    tokenizer.save_pretrained(root / "primed")
    return {"model": str(root / "primed"), "dataset": {"path": "json", "data_files": str(root / "train.jsonl")}}


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


@pytest.fixture
def tiny_into(tiny_results):
    """tiny_into(workdir): the built tiny study's results/tiny in `workdir` (a study with tiny.yaml's tiny section)."""
    import subprocess

    def copy(workdir):
        (workdir / "results").mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", str(tiny_results), str(workdir / "results" / "tiny")], check=True)

    return copy
