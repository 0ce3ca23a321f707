"""The environments the rules use agree with the project's own requirements."""

import tomllib

import yaml

from conftest import ROOT


def pip_pins(env_file: str) -> dict[str, str]:
    env = yaml.safe_load((ROOT / "envs" / env_file).read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    return dict(line.split("==") for line in pip if "==" in line and not line.startswith("-"))


def test_gpu_env_pins_the_gpu_extra():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    pins = pip_pins("gpu.yaml")
    assert dict(req.split("==") for req in extra) == {k: v for k, v in pins.items() if k not in ("jinja2", "jsonschema")}


def test_gpu_env_keeps_unsloths_limits():
    pins = pip_pins("gpu.yaml")
    assert tuple(map(int, pins["trl"].split("."))) <= (1, 15, 0)
    assert tuple(map(int, pins["transformers"].split("."))) <= (5, 17, 0)


def test_cpu_env_has_a_trl_whose_grpo_runs_without_triton():
    assert pip_pins("cpu.yaml")["trl"].startswith("1.16")


def test_gpu_lock_holds_the_gpu_pins():
    """envs/gpu.lock.txt (envs/resolve-gpu-lock.sh) resolved the very pins of the `gpu` extra."""
    import re

    def norm(name):
        return re.sub(r"[-_.]+", "-", name).lower()

    lock = {norm(name): version for name, version in (
        line.split("==") for line in (ROOT / "envs" / "gpu.lock.txt").read_text().splitlines() if line and not line.startswith("#"))}
    for name, version in pip_pins("gpu.yaml").items():
        if name not in ("jinja2", "jsonschema"):
            assert lock[norm(name)] == version, name
    assert lock["torch"] == "2.11.0" and lock["vllm"] == "0.26.0"


def test_make_takes_torchs_cpu_build_from_the_index_the_cpu_env_names():
    """A plain torch requirement on a stock machine pulls the CUDA build (gigabytes)."""
    env = yaml.safe_load((ROOT / "envs" / "cpu.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    index = next(line.split()[1] for line in pip if line.startswith("--extra-index-url"))
    torch_line = next(line for line in (ROOT / "Makefile").read_text().splitlines() if "torch==" in line)
    assert f"--index-url {index}" in torch_line and f"torch=={pip_pins('cpu.yaml')['torch']}" in torch_line
