"""What fixes a run's numbers, as one key: its settings, its code, the content of its input files, the revision of a
hub model or data set, the versions of the packages that train and the GPU model. The run cache (runcache) and the
compile caches are kept by it."""

import hashlib
import json
import os
import subprocess
from importlib import metadata
from pathlib import Path

from ..analysis import stats
from ..runtime.paths import RUN_CACHE

# The packages every backend trains with; a backend adds its own (Backend.packages)
TRAINING_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")


DIGESTS = "file-digests.json"  # content digests of input files by path, size, times and inode: hashed once


def _digest_file(path: Path, memo: dict) -> str:
    info = path.stat()
    # ctime too: a rewrite that keeps size and mtime (`cp -p`, a restore from backup) still changes it
    mark = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
    known = memo.get(str(path.resolve()))
    if known and known[:-1] == mark:
        return known[-1]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    memo[str(path.resolve())] = [*mark, digest.hexdigest()]
    return digest.hexdigest()


def _content(path: Path, digest, memo: dict) -> None:
    """Names and content digests of a file, or of every file under a folder, in a fixed order."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode() + b"\0")
        digest.update(_digest_file(file, memo).encode())


def key(settings: dict, code: str, inputs=(), identity: dict | None = None, cache: Path = Path(RUN_CACHE)) -> str:
    """The run's identity: settings, code hash, the content of its input files and folders, and `identity`
    (packages, devices, hub revisions: run_identity)."""
    digest = hashlib.sha256(json.dumps([settings, identity], sort_keys=True, default=str).encode() + b"\0" +
                            code.encode())
    memo_path = Path(cache) / DIGESTS
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    before = dict(memo)
    for path in sorted(map(Path, inputs)):
        _content(path, digest, memo)
    if memo != before:
        try:
            stats.write_text(memo_path, json.dumps(memo))  # a lost update only costs another hash
        except OSError:
            pass
    return digest.hexdigest()[:32]


def package_versions(backend_name: str, grpo: dict | None = None) -> dict[str, str | None]:
    """Versions of the packages that train this backend (a newer TRL or torch can change the numbers), with those
    that the settings it trains with need (`grpo`, the study's: a configuration's kernels, grpo_fields.NEEDS_PACKAGE)."""
    from ..training import backends
    from ..training.faults import grpo_settings
    from ..training.grpo_fields import NEEDS_PACKAGE

    names = list(TRAINING_PACKAGES)
    for _, requirement in backends.get(backend_name).packages:
        name = requirement.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip()
        names += [name] + (["unsloth_zoo"] if name == "unsloth" else [])
    settings = grpo_settings(backend_name, grpo or {})
    names += [requirement for key, (_, requirement, _) in NEEDS_PACKAGE.items() if settings.get(key)]
    versions = {}
    for name in dict.fromkeys(names):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_names(gpus_per_job: int) -> list[str]:
    """The models of the GPUs this job may lease (asked of the driver, so no CUDA context is made before the
    lease), or ["cpu"] for a CPU study."""
    if gpus_per_job == 0:
        return ["cpu"]
    from ..runtime.gpus import visible_devices

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ["unknown"]
    visible = set(visible_devices())
    rows = [[cell.strip() for cell in line.split(",", 2)] for line in out.splitlines() if line.count(",") >= 2]
    names = {name for index, uuid, name in rows if not visible or index in visible or uuid in visible}
    return sorted(names) or ["unknown"]


def hub_revision(repo_id: str, repo_type: str) -> str | None:
    """The commit a hub id resolves to now: asked of the hub where the network may be used, else read from the
    local hub cache (what from_pretrained/load_dataset will load offline); None where neither knows."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("0", "false", "no", ""):
        try:
            from huggingface_hub import HfApi

            info = (HfApi().model_info if repo_type == "model" else HfApi().dataset_info)(repo_id, timeout=30)
            if info.sha:
                return info.sha
        except Exception:  # no network, no such repo, a gated one: the cache may still know
            pass
    from huggingface_hub import constants

    ref = Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}" / "refs" / "main"
    try:
        return ref.read_text().strip() or None
    except OSError:
        return None


def run_identity(config: dict, backend: str, model_path: str, dataset: dict) -> tuple[dict | None, str]:
    """What beyond settings, code and input files fixes a run's numbers, or (None, why) where a hub id's
    revision is unknown (then the cache is not used: a run of another revision must not be restored)."""
    from .inputs import FILE_BUILDERS

    revisions = {}
    hub = [(model_path, "model")] if not Path(model_path).expanduser().exists() else []
    if dataset["path"] not in FILE_BUILDERS and not Path(dataset["path"]).expanduser().exists():
        hub.append((dataset["path"], "dataset"))
    for repo_id, repo_type in hub:
        revisions[f"{repo_type}:{repo_id}"] = hub_revision(repo_id, repo_type)
        if revisions[f"{repo_type}:{repo_id}"] is None:
            return None, (f"the revision of the hub {repo_type} {repo_id} is not known (no network, and not in the hub "
                          f"cache)")
    return {"packages": package_versions(backend, config.get("grpo")), "devices": device_names(config["gpus_per_train_job"]),
            "revisions": revisions}, ""

