#!/usr/bin/env bash
# Resolves the GPU stack (the `gpu` extra of pyproject.toml, with Snakemake and the rules' helpers) into
# envs/gpu.lock.txt, with pip's own resolver, as the GPU machine it has run on sees it: Python 3.12, and
# torch 2.11.0 with torchaudio 2.11.0, torchvision 0.26.0 and triton 3.6.0 already installed (that image's
# PyTorch, CUDA 13). Those four count as installed through metadata-only dist-info folders, so pip resolves
# the rest against them without fetching torch's CUDA wheels.
# Usage: envs/resolve-gpu-lock.sh [PYTHON3.12]   (needs a package index; about a minute)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3.12}
venv=$(mktemp -d)/venv
trap 'rm -rf "$(dirname "$venv")"' EXIT
"$py" -m venv "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
image=(torch==2.11.0 torchaudio==2.11.0 torchvision==0.26.0 triton==3.6.0)
for pin in "${image[@]}"; do
  name=${pin%%==*} version=${pin##*==}
  mkdir -p "$site/$name-$version.dist-info"
  printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$name" "$version" > "$site/$name-$version.dist-info/METADATA"
  echo pip > "$site/$name-$version.dist-info/INSTALLER"
done
extra=$(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["gpu"]))')
"$venv/bin/python" -m pip install -q --dry-run --report "$venv/report.json" $extra "snakemake>=9,<10" jinja2 jsonschema pyyaml
"$venv/bin/python" - "$venv/report.json" "${image[@]}" > envs/gpu.lock.txt <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
pins = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
pins.update(p.split("==") for p in sys.argv[2:])
print("# The GPU stack as resolved together by pip (envs/resolve-gpu-lock.sh), Python "
      f"{report['environment']['python_version']}: {len(pins)} packages. Use as constraints: pip install -c envs/gpu.lock.txt ...")
for name in sorted(pins):
    print(f"{name}=={pins[name]}")
PY
echo "envs/gpu.lock.txt: $(grep -vc '^#' envs/gpu.lock.txt) packages"
