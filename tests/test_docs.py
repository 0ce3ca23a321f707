"""The README and the guide behind it: short, linked, generated where they can be, and every command in them runs
as printed (Snakemake's with -n, on a copy of the project)."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT
from grpo_equivalence.study import reference

README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))  # the guide; docs/examples and docs/performance hold measurements
MAX_README_LINES = 200
# What a copy of the project needs for Snakemake to plan (the guide's commands name these folders)
PROJECT_FILES = ("Snakefile", "config.yaml", "pyproject.toml", "src", "workflow", "report_templates", "studies", "envs",
                 "profiles")


def links(path: Path) -> list[str]:
    """The relative targets of a Markdown file's links, without anchors."""
    found = re.findall(r"\]\(([^)\s]+)\)", path.read_text())
    return [t.split("#")[0] for t in found if not re.match(r"[a-z]+:", t) and t.split("#")[0]]


def commands(path: Path) -> list[str]:
    """The commands of a Markdown file's bash blocks, comments and blank lines left out."""
    found = []
    for block in re.findall(r"^```bash\n(.*?)^```", path.read_text(), re.M | re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                found.append(line)
    return found


def test_the_readme_is_short_and_links_every_page_of_the_guide():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES
    linked = {(README.parent / target).resolve() for target in links(README)}
    assert set(PAGES) - linked == set(), "docs pages the README does not link"


def test_each_reliability_promise_of_the_readme_names_tests_that_exist():
    """Each keyword of a row of the README's Reliability table selects a test (`pytest -k` matches test names)."""
    section = README.read_text().split("## Reliability", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith(("| Promise", "| ---"))]
    names = re.findall(r"^def (test_\w+)", "".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py")), re.M)
    assert len(rows) >= 6
    for row in rows:
        expression = re.findall(r"`([^`]+)`", row.rsplit("|", 2)[1])[0]
        missing = [k for k in expression.split(" or ") if not any(k in name for name in names)]
        assert not missing, f"{row[:60]}...: no test named with {missing}"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_every_link_leads_to_a_file_of_the_project(page):
    missing = [target for target in links(page) if not (page.parent / target).exists()]
    assert not missing, missing


def test_the_configuration_reference_is_what_the_schema_gives():
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == reference.render(), "docs/configuration.md is out of date with the schema: run make docs"


def test_the_readmes_study_is_the_example_study_and_it_is_valid(tmp_path):
    import yaml

    from grpo_equivalence.study.validate import check

    shown = re.search(r"^```yaml\n(.*?)^```", README.read_text(), re.M | re.S).group(1)
    example = ROOT / "studies" / "example"
    assert shown == (example / "study.yaml").read_text()
    readme = README.read_text()
    first_problem = next(line for line in (example / "problems.jsonl").read_text().splitlines() if "15 percent" in line)
    assert first_problem in readme
    assert re.search(r"^def correct_answer\(completions, answer, \*\*kwargs\):$", (example / "rewards.py").read_text(), re.M)
    check(yaml.safe_load(shown), [example, ROOT])  # the rewards, the template and the data file it names are there


def test_the_readmes_answer_is_that_of_the_example_it_names():
    """The README's answer table is the current decision, grad_norm effect and speed on the runs of the example it
    names, and its sampler column the example's report's rollout judgment."""
    from helpers import tables_headed

    readme = README.read_text()
    example = ROOT / "docs" / "examples" / "h100-headline-study"
    assert "(docs/examples/h100-headline-study/README.md)" in readme
    report = (example / "grpo_equivalence.md").read_text()
    answer = {row["Candidate"]: row for row in tables_headed(report, "Candidate", "Decision")[0]}
    verdicts = {row["Candidate"]: row for row in tables_headed(report, "Candidate", "loss")[0]}
    shown = {row["Candidate"].strip("`"): row for row in tables_headed(readme, "Candidate", "Decision")[0]}
    assert set(shown) == set(answer)
    words = {"**trains differently**": "**trains differently**", "**not decided**": "not decided",
             "**trains as": "trains as"}  # the report's decision, as the README's cell opens

    def sampler(cell):
        if "sampler correct (on its own logits)" in cell:
            return "correct, on its own logits"
        if "sampler **divergent**" in cell and "on its own logits" in cell and "too cold" in cell:
            return "**divergent**, on its own logits (keeps fewer tokens), as vllm's may be"
        assert "sampler **divergent**" in cell and "too hot" in cell and "against the reference's" in cell, cell
        return "hotter than vllm's"

    for name, row in shown.items():
        said = answer[name]["Decision"]
        assert row["Decision"].startswith(next(w for d, w in words.items() if said.startswith(d))), (name, said)
        grad = verdicts[name]["grad_norm"]  # "open: 1.29x (1.09 to 1.53)"
        verdict, effect = grad.split(": ", 1)
        assert row["grad_norm, x vllm's"] == f"{effect}, {verdict}", name
        assert row["Sampler at fixed weights"] == sampler(answer[name]["Rollout at fixed weights"]), name
        median, pct = re.match(r"30 steps: (\S+) s .*?, (\d+) %", answer[name]["Speed"]).groups()
        assert row["Median step, % of vllm"] == f"{median} s, {pct} %", name


def run_as_printed(command: str, project: Path) -> subprocess.CompletedProcess:
    """A command of the guide, on a copy of the project: Snakemake's as a dry run, make's as make -n, installs by
    what they name (the GPU stack cannot install on a CPU machine), the command-line tools as they are."""
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    program = command.split()[0]
    if program == "snakemake":
        command += " -n"
    elif program == "make":
        command = command.replace("make ", "make -n ", 1)
    elif program == "pip":
        extras = set(re.search(r'"\.\[([\w,]+)\]"', command).group(1).split(","))
        declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        constraints = re.findall(r"-c (\S+)", command)
        assert extras <= set(declared) and all((ROOT / c).is_file() for c in constraints), command
        return subprocess.CompletedProcess(command, 0, "", "")
    elif program == "python3" and command.startswith("python3 -m venv .venv && . .venv/bin/activate"):
        pass  # an environment of its own, made in the project's copy as printed
    else:
        assert program.startswith("grpo-"), f"a command the guide's test does not know how to run: {command}"
    return subprocess.run(command, shell=True, cwd=project, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = tmp_path_factory.mktemp("project")
    for name in PROJECT_FILES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(ROOT / name, project / name)
    shutil.copy2(ROOT / "Makefile", project / "Makefile")
    (project / "docs").symlink_to(ROOT / "docs")  # the command-line tools read the examples' runs
    return project


@pytest.mark.parametrize("command", sorted({c for page in [README, *PAGES] for c in commands(page)}))
def test_every_command_runs_as_printed(command, project):
    done = run_as_printed(command, project)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def test_the_missions_command_form_plans_the_report(project):
    """The command as a GPU box's user types it, with no target: the report is the default one, and config.yaml's
    whole study is planned (config.yaml's own "# Run:" line names the target first, as the README does)."""
    command = "snakemake --cores 8 --resources gpu=4"
    run_line = re.search(r"^# Run: (.+)$", (ROOT / "config.yaml").read_text(), re.M).group(1)
    assert run_line.startswith("snakemake results/grpo_equivalence.md ")  # a target after --resources would be a resource
    done = run_as_printed(command, project)
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    assert re.search(r"^\s+output: results/grpo_equivalence\.md$", done.stdout, re.M), done.stdout[-2000:]


def test_the_readmes_calibration_table_is_the_grid_of_the_verdicts_page():
    """README's error rates of the training verdict: the largest of docs/verdicts.md's grid (benchmarks/
    verdict_calibration.py), and its power at variance ratio 1."""
    page = (ROOT / "docs" / "verdicts.md").read_text()
    grid = [[float(c.strip(" %")) for c in row.strip("|").split("|")]
            for row in re.findall(r"^\| -?[\d.]+ \| [\d.]+ \| [\d.]+ % \|.*\|$", page, re.M)]
    assert len(grid) == 15 and all(row[2] <= 5.5 and row[3] <= 5.5 and row[5] <= 5.5 for row in grid)
    power = lambda col: " / ".join(f"{row[col]:.0f}" for c in (0.0, 0.6, 0.9) for row in grid  # noqa: E731
                                    if row[0] == c and row[1] == 1.0)
    readme = README.read_text()
    most = lambda col: max(row[col] for row in grid)  # noqa: E731
    assert f"| fixed (ratio, units) | at most {most(2):.1f} % | at most {most(5):.1f} % | {power(6)} % |" in readme
    assert f"| 1 SD of the reference's runs | at most {most(2):.1f} % | at most {most(3):.2f} % | {power(4)} % |" in readme


def test_no_description_of_the_schema_is_cut_at_a_comma():
    """In a YAML flow mapping ({type: ..., description: ...}) an unquoted comma ends the description: the reference
    page showed four cut off. Every flow-mapped description with a comma is quoted."""
    cut = [line.strip() for line in (ROOT / "workflow/schemas/config.schema.yaml").read_text().splitlines()
           if (m := re.search(r"\{.*description: (?![\"'])(.*)\}\s*$", line)) and "," in m.group(1)]
    assert not cut, cut


def test_no_committed_report_or_page_links_a_file_that_does_not_exist():
    """Every Markdown file under docs (the example reports with their figures among them): each relative link and
    image leads to a file of the project."""
    missing = [f"{page.relative_to(ROOT)} -> {target}" for page in sorted((ROOT / "docs").rglob("*.md"))
               for target in links(page) if not (page.parent / target).exists()]
    assert not missing, missing
