"""The committed example reports are made of their committed statistics files."""

import re

import pytest

from conftest import ROOT
from grpo_equivalence import stats
from grpo_equivalence.summary import summarise

EXAMPLES = sorted(p for p in (ROOT / "docs" / "examples").iterdir() if (p / "grpo_equivalence.md").exists())


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_report_rows_come_from_its_statistics(example):
    report = (example / "grpo_equivalence.md").read_text()
    tables = {int(n): body for n, body in re.findall(r"^## (\d+) steps\n(.*?)(?=^## )", report, re.M | re.S)}
    runs = [stats.load(p) for p in sorted((example / "stats").glob("grpo_*.json")) if ".summary" not in p.name]
    assert runs and {r["max_steps"] for r in runs} == set(tables)
    for run in runs:
        assert all(step["kl"] is not None for step in run["steps"])  # KL logged for every backend
        summary = summarise(run)
        row = f"| {run['backend']} | {summary['train_wall_s']:.1f} | {summary['median_step_s']:.3f} | {summary['peak_mem_gb']:.2f} |"
        assert row in tables[run["max_steps"]], row


def test_an_h200_example_has_vllm_as_reference_against_every_backend():
    from helpers import tables_headed

    example = ROOT / "docs" / "examples" / "h200-vllm-reference"
    report = (example / "grpo_equivalence.md").read_text()
    assert "Reference backend: **vllm**" in report
    runs = [stats.load(p) for p in sorted((example / "stats").glob("grpo_*.json")) if ".summary" not in p.name]
    assert {r["backend"] for r in runs} == {"vllm", "unsloth_fi_false", "cb_paged", "hf", "trl_vllm"}
    assert all(r["environment"]["gpu_name"] == "NVIDIA H200" for r in runs)
    for table in tables_headed(report, "Candidate"):
        assert {row["Candidate"] for row in table} == {"unsloth_fi_false", "cb_paged", "hf", "trl_vllm"}
    assert len(tables_headed(report, "Candidate")) == 2  # 10 and 30 steps
