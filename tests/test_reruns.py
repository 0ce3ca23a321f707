"""After a change, exactly what it made stale reruns: asserted from Snakemake's own plan (a dry run).

A copy of the project gets the session's run of the tiny study (conftest.tiny_run, made by the project itself);
each test edits the copy, asks Snakemake what it would run, and puts the copy back.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, TINY_RUN, copy_run
from helpers import SMALL_ROLLOUT_CHECK

pytestmark = pytest.mark.workflow
PROJECT_FILES = ("Snakefile", "config.yaml", "pyproject.toml", "src", "workflow", "report_templates", "studies", "envs")
STEPS = tuple(TINY_RUN["steps"])
BACKENDS = ("hf", "cb_paged", "hf_static")  # the tiny study's, hf the reference
SEEDS = {"hf": TINY_RUN["replicates"]["reference"], "cb_paged": TINY_RUN["replicates"]["others"],
         "hf_static": TINY_RUN["replicates"]["others"]}
CANDIDATES = len(BACKENDS) - 1  # each compared with hf


def snakemake(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "results/grpo_equivalence.md", "--cores", "2",
                           "--config", "study=study.yaml", *args], cwd=project, capture_output=True, text=True)


def plan(project: Path) -> set[tuple[str, str]]:
    """(rule, output) of every job a dry run would run."""
    result = snakemake(project, "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    jobs, rule = set(), None
    for line in result.stdout.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):$", line):
            rule = m.group(1)
        elif rule and (m := re.match(r"^\s+output: (\S+)", line)):
            jobs.add((rule, m.group(1).rstrip(",")))
            rule = None
    return jobs


def rules(jobs) -> dict[str, int]:
    counts = {}
    for rule, _ in jobs:
        counts[rule] = counts.get(rule, 0) + 1
    return counts


def train_outputs(backend: str, steps: int) -> set[str]:
    """The statistics files of one backend and step count: the study's seed, then its replicates."""
    return {f"results/stats/grpo_{backend}_{steps}" + (f"_seed{3407 + i}" if i else "") + ".json"
            for i in range(SEEDS[backend])}


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_run):
    project = tmp_path_factory.mktemp("project")
    for name in PROJECT_FILES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(ROOT / name, project / name)
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A"], cwd=project, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "study"], cwd=project, check=True)
    copy_run(tiny_run, project)  # the study's outputs and study file, as its run left them (not in the repository)
    return project


@pytest.fixture
def edit(project):
    """edit(path, change) rewrites a file of the copy with change(text); restored after the test."""
    saved = {}

    def apply(relative, change):
        path = project / relative
        saved.setdefault(path, path.read_text())
        path.write_text(change(path.read_text()))

    yield apply
    for path, text in saved.items():
        path.write_text(text)


def test_nothing_changed_nothing_runs(project):
    assert plan(project) == set()


def test_template_changed_only_the_report(project, edit):
    edit("report_templates/grpo_equivalence.md.j2", lambda t: t + "\nA closing line.\n")
    assert plan(project) == {("render_report", "results/grpo_equivalence.md")}


@pytest.mark.parametrize("changed", ["src/grpo_equivalence/analysis/compare.py",
                                     "src/grpo_equivalence/analysis/boundaries.json"])  # data the verdict reads
def test_comparison_code_changed_comparisons_and_report_no_training(project, edit, changed):
    edit(changed, lambda t: t + ("\n# a comment changes the content\n" if changed.endswith(".py") else "\n"))
    assert rules(plan(project)) == {"compare": CANDIDATES * len(STEPS), "render_report": 1}


def test_one_backends_loader_changed_only_its_jobs(project, edit):
    edit("src/grpo_equivalence/training/backends/cb_paged.py", lambda t: t + "\n# changed\n")
    jobs = plan(project)
    assert {out for rule, out in jobs if rule == "train"} == set().union(*(train_outputs("cb_paged", s) for s in STEPS))
    assert {out for rule, out in jobs if rule == "rollout_check"} == {"results/rollout/cb_paged.json"}
    assert {out for rule, out in jobs if rule.startswith("trainer_")} == {
        "results/trainer/cb_paged.json", "results/trainer/cb_paged_vs_hf.json"}  # its trainer check, not the others'
    assert rules(jobs) == {"train": SEEDS["cb_paged"] * len(STEPS), "rollout_check": 1, "summarise": len(STEPS),
                           "compare": len(STEPS), "plot_curves": len(STEPS), "plot_speed": 1, "render_report": 1,
                           "trainer_check": 1, "trainer_compare": 1}


def test_one_backends_settings_changed_only_its_jobs(project, edit):
    edit("study.yaml", lambda t: t.replace("num_blocks: 32", "num_blocks: 33"))
    jobs = plan(project)
    assert {out for rule, out in jobs if rule == "train"} == set().union(*(train_outputs("cb_paged", s) for s in STEPS))


def test_a_new_step_count_runs_only_the_new_jobs(project, edit):
    edit("study.yaml", lambda t: t.replace(f"- {STEPS[-1]}\n", f"- {STEPS[-1]}\n- 7\n"))
    jobs = plan(project)
    assert {out for rule, out in jobs if rule == "train"} == set().union(*(train_outputs(b, 7) for b in BACKENDS))
    # a new longest run: the trainer checks read the learning-rate schedule of the longest, so they (not the batch) rerun
    assert rules(jobs) == {"train": sum(SEEDS.values()), "summarise": len(BACKENDS), "compare": CANDIDATES,
                           "plot_curves": 1, "plot_speed": 1, "render_report": 1,
                           "trainer_check": len(BACKENDS) + 1, "trainer_compare": CANDIDATES + 1}


@pytest.mark.parametrize("shared", ["src/grpo_equivalence/training/rewards.py", "src/grpo_equivalence/training/train.py",
                                    "src/grpo_equivalence/training/backends/base.py"])
def test_rewards_or_shared_training_code_changed_all_train_jobs(project, edit, shared):
    edit(shared, lambda t: t + "\n# changed\n")
    trains = {out for rule, out in plan(project) if rule == "train"}
    assert trains == set().union(*(train_outputs(b, s) for b in BACKENDS for s in STEPS))


def test_a_rules_script_changed_only_its_jobs(project, edit):
    edit("workflow/scripts/summarise.py", lambda t: t + "\n# changed\n")
    assert rules(plan(project)) == {"summarise": len(BACKENDS) * len(STEPS), "plot_speed": 1, "render_report": 1}


def test_touching_files_without_changing_them_reruns_nothing(project):
    for path in [*(project / "src").rglob("*.py"), *(project / "workflow" / "scripts").glob("*.py")]:
        path.touch()
    (project / "report_templates" / "grpo_equivalence.md.j2").touch()
    assert plan(project) == set()


def test_a_fresh_clone_of_an_unchanged_tree_reruns_nothing(project, tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(project), str(clone)], check=True)
    for kept in ("results", ".snakemake", "study.yaml"):  # outputs and Snakemake's records, as they were
        subprocess.run(["cp", "-a", str(project / kept), str(clone / kept)], check=True)
    assert plan(clone) == set()


def test_verdict_settings_changed_only_the_comparisons(project, edit):
    edit("study.yaml", lambda t: t.replace("margin: 1.0", "margin: 2.0"))
    assert rules(plan(project)) == {"compare": CANDIDATES * len(STEPS), "render_report": 1}


def test_another_reference_seed_trains_only_that_seed(project, edit):
    seeds = SEEDS["hf"]
    edit("study.yaml", lambda t: t.replace(f"reference: {seeds}", f"reference: {seeds + 1}"))
    jobs = plan(project)
    assert {out for rule, out in jobs if rule == "train"} == {f"results/stats/grpo_hf_{s}_seed{3407 + seeds}.json"
                                                              for s in STEPS}
    assert rules(jobs) == {"train": len(STEPS), "compare": CANDIDATES * len(STEPS), "plot_curves": len(STEPS),
                           "render_report": 1}


def test_two_studies_keep_their_reports_apart_share_finished_runs_and_make_report_writes_each(project):
    """A second study in the same checkout writes to its own folder (by default results/NAME, here results/second),
    leaves the first's report as it was, and restores the runs the first one finished from the shared run cache
    (a run's key leaves out the study's other backends and its reference: here another one, cb_paged); `make
    report` writes each study's HTML report into its folder."""
    first = (project / "results/grpo_equivalence.md").read_bytes()
    config = yaml.safe_load((project / "study.yaml").read_text())
    del config["results"]
    config.update(backends=["hf", "cb_paged"], reference="cb_paged", steps=[4],
                  replicates={"reference": 3, "others": 3}, rollout_check=SMALL_ROLLOUT_CHECK, trainer_check=False)
    (project / "second.yaml").write_text(yaml.safe_dump(config))
    second = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--config", "study=second.yaml"],
                            cwd=project, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (project / "results/grpo_equivalence.md").read_bytes() == first
    report = (project / "results/second/grpo_equivalence.md").read_text()
    assert "Reference backend: **cb_paged**" in report and "| hf |" in report and "hf_static" not in report
    for run in ("hf_4", "hf_4_seed3408", "hf_4_seed3409", "cb_paged_4", "cb_paged_4_seed3408", "cb_paged_4_seed3409"):
        assert "restored from the run cache" in (project / f"results/second/logs/train/{run}.log").read_text(), run
    shutil.copy2(ROOT / "Makefile", project / "Makefile")
    venv = Path(sys.executable).parents[1]  # the one running these tests: make neither creates nor installs it
    for study, folder in (("study.yaml", "results"), ("second.yaml", "results/second")):
        made = subprocess.run(["make", "-o", f"{venv}/.installed", "report", f"STUDY={study}", f"VENV={venv}"],
                              cwd=project, capture_output=True, text=True)
        assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-3000:]
        html = project / folder / "report.html"
        assert f"report: {folder}/report.html" in made.stdout and html.stat().st_size > 10_000


def test_a_learning_rate_change_reruns_training_and_the_trainer_check_not_the_checks_that_sample(project, edit):
    """The rollout checks and the trainer check's batch sample at fixed weights: the learning rate (an optimiser
    setting) does not change what they sample, and they do not rerun; every train job and every trainer check does."""
    edit("study.yaml", lambda t: t.replace("learning_rate: 0.0005", "learning_rate: 0.0004"))
    jobs = rules(plan(project))
    assert "rollout_check" not in jobs and "trainer_batch" not in jobs, jobs
    assert jobs["train"] == sum(SEEDS.values()) * len(STEPS) and jobs.get("trainer_check", 0) >= len(BACKENDS)


def test_a_statistics_file_edited_copied_back_or_deleted_reruns_what_reads_it_and_an_edit_is_said_loudly(
        project, tmp_path):
    """An edited statistics file may be deliberate: what reads it reruns, and the report and the console name it.
    Copied back with its old times (cp -a), what read the edit reruns again; deleted, the run is restored from the
    run cache and what reads it reruns. (Snakemake's times alone missed the last two: "Nothing to be done".)"""
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(project), str(copy)], check=True)
    stats = copy / "results/stats/grpo_hf_static_4.json"
    original = tmp_path / "original.json"
    subprocess.run(["cp", "-a", str(stats), str(original)], check=True)
    data = json.loads(stats.read_text())
    data["steps"][-1]["loss"] += 1.0
    stats.write_text(json.dumps(data))
    assert {"compare", "render_report"} <= set(rules(plan(copy)))
    done = snakemake(copy)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{stats.relative_to(copy)} was edited after its train job wrote it" in done.stderr
    assert "**Edited by hand**: results/stats/grpo_hf_static_4.json" in (copy / "results/grpo_equivalence.md").read_text()
    subprocess.run(["cp", "-a", str(original), str(stats)], check=True)  # back, with its old modification time
    assert {"compare", "render_report"} <= set(rules(plan(copy)))
    assert snakemake(copy).returncode == 0
    assert "Edited by hand" not in (copy / "results/grpo_equivalence.md").read_text()
    stats.unlink()
    jobs = rules(plan(copy))
    assert jobs.get("train") == 1 and "render_report" in jobs, jobs
