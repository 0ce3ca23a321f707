"""Where a run ran: package versions, accelerator, and the project's git commit."""

import os
import platform
import subprocess
from importlib import metadata

from .paths import PROJECT

PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "unsloth", "unsloth_zoo", "vllm",
            "liger-kernel", "snakemake")


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> str | None:
    """HEAD of the project, with "-dirty" when tracked files differ from it.

    A copy of the tree without its .git (a cluster's staging copy, an archive) can name its commit in
    GRPO_EQUIVALENCE_COMMIT.
    """
    if os.environ.get("GRPO_EQUIVALENCE_COMMIT"):
        return os.environ["GRPO_EQUIVALENCE_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def accelerator() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"gpu_name": None, "gpu_count": 0, "gpu_memory_gb": None, "driver": None, "cuda": None}
    driver = None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=30)
        driver = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return {"gpu_name": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count(),
            # GB = 1e9 bytes, as every memory figure; what a fraction such as vLLM's gpu_memory_utilization is of
            "gpu_memory_gb": torch.cuda.get_device_properties(0).total_memory / 1e9, "driver": driver,
            "cuda": torch.version.cuda}


def describe() -> dict:
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": package_versions(),
            **accelerator(), "git_commit": git_commit()}
