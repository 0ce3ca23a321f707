"""The numerics bound against the GPU's rows (grpo_equivalence.checks.own_verdict.NUMERICS_BOUND).

Reads every committed rollout check of a GPU example (docs/examples/*/rollout), every GPU fault row
(docs/faults/gpu-exact/*.json) in bfloat16, and the CPU's fault rows (docs/faults/cpu-exact/*.json, either dtype),
and counts, per backend, the checks whose mean |sampler - trainer|
log-probability of a drawn token lies beyond the bound: a correct backend there is a false flag, the float8 rollout
(fp8_rollout) a detection. A fault row's sampling faults (temperature, min_p, top_k, the kernel's rule) change what
is drawn, not the logits drawn from: their checks count as the backend's correct numerics ("none"). Prints one row
per backend and fault, with the lowest and highest mismatch.

    python benchmarks/numerics_bound.py
"""

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from grpo_equivalence.checks.own_verdict import NUMERICS_BOUND  # noqa: E402


def _load(path: Path):
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


def mismatches() -> dict[tuple[str, str, str], list[tuple[float, str]]]:
    """{(where, backend, fault or "none"): [(mean |d|, file)]} of every check that reported its sampler's logits:
    bfloat16 on a GPU, and the CPU's fault rows."""
    found: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for path in sorted((ROOT / "docs/examples").glob("*/rollout/*.json*")):
        check = _load(path)
        numerics = check.get("numerics") or {}
        if check.get("dtype") == "bfloat16" and numerics.get("mean_abs_logp_diff") is not None:
            key = ("GPU, bfloat16", check["backend"], check.get("fault") or "none")
            found.setdefault(key, []).append((numerics["mean_abs_logp_diff"], str(path.relative_to(ROOT))))
    rows = sorted((ROOT / "docs/faults/gpu-exact").glob("*.json")) + sorted((ROOT / "docs/faults/cpu-exact").glob("*.json"))
    for path in rows:
        row = _load(path)
        if not isinstance(row, dict) or "checks" not in row or (row.get("gpu") and row.get("dtype") != "bfloat16"):
            continue
        where = f"GPU, {row['dtype']}" if row.get("gpu") else f"CPU, {row['dtype']}"
        for check in row.get("checks", []):
            value = (check.get("numerics") or [None])[0]
            if value is None:
                continue
            fault = check["candidate"] if check["candidate"] in ("fp8_rollout",) else "none"
            backend = row["backend"] + (" (exact_top_p)" if row.get("exact_top_p") else "")
            found.setdefault((where, backend, fault), []).append((value, str(path.relative_to(ROOT))))
    return found


def main() -> dict:
    rows = {}
    print(f"bound {NUMERICS_BOUND:.4g} (mean |d| a token)")
    print("| Where | Backend | Fault | Checks | Mean \\|d\\|, lowest to highest | Beyond the bound |")
    print("| --- | --- | --- | ---: | --- | ---: |")
    for (where, backend, fault), values in sorted(mismatches().items(), key=lambda item: (item[0][0][:3] != "GPU", item[0])):
        numbers = [v for v, _ in values]
        beyond = sum(v > NUMERICS_BOUND for v in numbers)
        rows[f"{where}/{backend}/{fault}"] = {"checks": len(numbers), "low": min(numbers), "high": max(numbers),
                                              "beyond": beyond}
        print(f"| {where} | {backend} | {fault} | {len(numbers)} | {min(numbers):.4f} to {max(numbers):.4f} | {beyond} |")
    return rows


if __name__ == "__main__":
    main()
