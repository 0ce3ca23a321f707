"""The whole workflow through Snakemake on the tiny study: real jobs, then the report checked against the
statistics files it was made from, and Snakemake's own plan for a rerun."""

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, TINY_RUN, copy_run, tiny_run_config, tiny_yaml
from helpers import tables_headed

pytestmark = pytest.mark.workflow
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile")]
STEPS = tuple(TINY_RUN["steps"])
REPLICATES = TINY_RUN["replicates"]  # seeds 3407..3409 of each backend: the first planned look
CANDIDATES = ("cb_paged", "hf_static")  # the tiny study's backends besides the reference, hf


def snakemake(workdir: Path, *args: str, check=True) -> subprocess.CompletedProcess:
    """The tiny study with two short step counts (TINY_RUN), in `workdir` (its config is written there)."""
    (workdir / "study.yaml").write_text(yaml.safe_dump(tiny_run_config()))
    cmd = [*SNAKEMAKE, "--directory", str(workdir), "results/grpo_equivalence.md", "--cores", "2",
           "--config", f"study={workdir / 'study.yaml'}", *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_run):
    """The session's run of the tiny study (conftest.tiny_run), in a folder of this module's own."""
    workdir = tmp_path_factory.mktemp("study")
    copy_run(tiny_run, workdir)
    return workdir


def load(workdir, backend, steps, seed=None):
    name = f"grpo_{backend}_{steps}" + (f"_seed{seed}" if seed is not None else "")
    return json.loads((workdir / f"results/stats/{name}.json").read_text())


def seeds(backend):
    return [3407 + i for i in range(REPLICATES["reference" if backend == "hf" else "others"])]


def test_every_job_ran_and_logged(study):
    for backend in ("hf", *CANDIDATES):
        for steps in STEPS:
            run = load(study, backend, steps)
            assert [s["step"] for s in run["steps"]] == list(range(1, steps + 1))
            assert (study / f"results/logs/train/{backend}_{steps}.log").read_text().strip()
    assert (study / "results/tiny/primed/config.json").exists()
    assert "prime step" in (study / "results/logs/prime.log").read_text()


def test_a_cpu_studys_jobs_ran_in_its_job_server_which_stopped_with_the_workflow(study):
    """job_server (on by default): every train and rollout job forked from the interpreter that imported TRL once
    (those that start while it imports wait for it)."""
    served = "[job server] running in the workflow's job server"
    logs = [*(study / "results/logs/train").glob("*.log"), *(study / "results/logs/rollout").glob("*.log")]
    assert len(logs) == 22
    for log in logs:
        assert log.read_text().startswith(served), log.read_text()[:500]
    server_log = (study / "results/logs/jobserver.log").read_text()
    assert "imported torch, transformers, peft, datasets, trl" in server_log and "refused" not in server_log
    assert "the workflow has ended: stopping" in server_log


def test_each_backend_trained_with_its_own_options(study):
    tiny = tiny_yaml()
    trainer = load(study, "cb_paged", STEPS[0])["effective_config"]["trainer"]
    assert trainer["use_transformers_continuous_batching"] is True
    assert trainer["transformers_continuous_batching_config"] == tiny["backend_options"]["cb_paged"]["continuous_batching"]


def test_report_speed_tables_match_the_statistics(study):
    report = (study / "results/grpo_equivalence.md").read_text()
    assert re.findall(r"^## (\d+) steps$", report, re.M) == [str(s) for s in STEPS]
    speed_tables = tables_headed(report, "Backend", "Train wall (s)")

    def run_median(run):
        return statistics.median(s["wall_s"] for s in run["steps"] if s["step"] > 3)

    def over_runs(backend, steps):  # the answer's basis: the median over every run (on the CPU, every run counts)
        first = seeds(backend)[0]
        return statistics.median(run_median(load(study, backend, steps, None if s == first else s))
                                 for s in seeds(backend))

    for table, steps in zip(speed_tables, STEPS, strict=True):
        ref_median = over_runs("hf", steps)
        rows = {row["Backend"]: row for row in table}
        for backend in ("hf", *CANDIDATES):
            run = load(study, backend, steps)
            median = statistics.median(s["wall_s"] for s in run["steps"] if s["step"] > 3)
            row = rows[backend]
            assert row["Train wall (s)"] == f"{run['train_wall_s']:.1f}"
            assert row["Median step (s)"] == f"{median:.3f}"
            assert row["Peak mem (GB)"] == f"{run['peak_mem_gb']:.2f}"
            assert row["% of hf"].startswith(f"{100 * ref_median / over_runs(backend, steps):.1f} %")
            assert row["Start-up (s)"] == f"{run['startup_s']:.1f}" and 0 < run["startup_s"] < run["train_wall_s"] * 10


def test_replicates_ran_with_their_own_seeds(study):
    for backend in ("hf", *CANDIDATES):
        for steps in STEPS:
            for seed in seeds(backend)[1:]:
                run = load(study, backend, steps, seed)
                assert run["seed"] == seed and run["effective_config"]["trainer"]["seed"] == seed
            rewards = [[s["reward"] for s in load(study, backend, steps, seed if seed != 3407 else None)["steps"]]
                       for seed in seeds(backend)]
            assert len({tuple(r) for r in rewards}) == len(rewards)  # reseeding changed the run


def test_report_verdicts_match_the_statistics(study):
    """Every verdict and its evidence, recomputed here from the statistics files of all seeds: each comparison
    with Holm over its own metrics (its family; no correction across the candidates)."""
    from grpo_equivalence.analysis import effects, verdict
    from grpo_equivalence.analysis.compare import compare

    report = (study / "results/grpo_equivalence.md").read_text()
    verdict_tables = tables_headed(report, "Candidate", "loss")[0::2]  # per step count: verdicts, step by step
    evidence_tables = tables_headed(report, "Candidate", "Metric")
    assert len(verdict_tables) == len(evidence_tables) == len(STEPS)
    expected = {}
    for steps in STEPS:
        refs = [load(study, "hf", steps, s if s != 3407 else None) for s in seeds("hf")]
        for candidate in CANDIDATES:
            cands = [load(study, candidate, steps, s if s != 3407 else None) for s in seeds(candidate)]
            expected[(steps, candidate)] = compare(refs, cands)["metrics"]
    for steps, verdicts, evidence in zip(STEPS, verdict_tables, evidence_tables):
        assert [row["Candidate"] for row in verdicts] == list(CANDIDATES)
        for candidate, verdict_row in zip(CANDIDATES, verdicts):
            rows = {row["Metric"]: row for row in evidence if row["Candidate"] == candidate}
            for metric in verdict.METRICS:
                want = expected[(steps, candidate)][metric]["verdict"]
                said = {"inconclusive": "open"}.get(want["verdict"], want["verdict"])  # the report's one word
                assert verdict_row[metric].strip("*").startswith(said), (candidate, metric)
                if want.get("effect"):  # the effect and its interval, in the metric's terms
                    assert effects.words(want["effect"]) in verdict_row[metric], (candidate, metric)
                assert rows[metric]["Runs (reference/candidate, paired)"] == "3/3, 3"
                assert float(rows[metric]["Difference"]) == pytest.approx(want["difference"], rel=1e-3, abs=1e-6)
                assert rows[metric]["Verdict, because"].startswith(said)


def test_report_has_the_rollout_check_with_its_verdicts(study):
    """The rollout check of every backend and of the reference at a second seed, judged as the report says."""
    from grpo_equivalence.checks import rollout
    from grpo_equivalence.report import sections as report_module
    from grpo_equivalence.training import faults

    report = (study / "results/grpo_equivalence.md").read_text()
    assert "## Rollout check at fixed weights" in report
    files = [rollout.load(study / f"results/rollout/{name}.json") for name in ("hf", *CANDIDATES, "hf_seed3408")]
    section = report_module.rollout_section(files, "hf")
    rows = tables_headed(report, "Backend", "support")[0]
    assert [row["Backend"] for row in rows] == [c["label"] + (" (control)" if c["control"] else "")
                                                for c in section["comparisons"]]
    for row, comparison in zip(rows, section["comparisons"]):
        assert row["Rollout verdict"].strip("*").startswith(comparison["verdict"])
        assert comparison["verdict"] != "divergent", comparison["tests"]  # every tiny backend samples as set
    assert all(sum(c["tokens"] for c in f["completions"]) > 10_000 for f in files)
    # what the check can detect at these settings, per named sampling fault, from the reference's own file
    power_rows = tables_headed(report, "Fault", "Effect at these settings", "Power here")[0]
    assert [row["Fault"].split(":")[0] for row in power_rows] == [*faults.SAMPLING, "a correct sampler confirmed equivalent"]
    for row, stated in zip(power_rows, section["power"], strict=True):
        assert row["Power here"] == (f"{round(100 * stated['power'])} %" if stated["power"] is not None else "-")


def test_the_trainer_check_finds_the_tiny_studys_trainer_stacks_the_same(study):
    """Every tiny backend trains with TRL + PEFT: at fixed weights on the reference's batch, each computes what hf
    computes, and the report says so, per backend and for the control (hf in bfloat16)."""
    report = (study / "results/grpo_equivalence.md").read_text()
    assert "## Trainer check at fixed weights" in report
    rows = tables_headed(report, "Backend", "Where it parts from hf")[0]
    assert [row["Backend"] for row in rows] == [*CANDIDATES, "hf (control)"]
    assert all(row["Where it parts from hf"].startswith("nowhere") for row in rows), rows
    check = json.loads((study / "results/trainer/hf.json").read_text())
    assert check["tokens"] > 0 and check["kl_mean"] > 0 and check["normaliser"] == pytest.approx(check["tokens"], rel=1e-3)
    # the batch has advantages (a batch whose groups all tie has no policy term to compare), and the report says so
    assert check["with_advantage"] > 0 and f"{check['with_advantage']} with an advantage" in report
    assert "No completion of the batch has an advantage" not in report


def test_hf_static_is_equivalent_to_hf(study):
    """On the CPU transformers does not compile, and hf_static (a static KV cache) samples exactly as hf does:
    every seed's run equals hf's, so the verdict on the shared seeds is equivalent on every metric."""
    from grpo_equivalence.analysis import stats, verdict

    report = (study / "results/grpo_equivalence.md").read_text()
    for steps, verdicts, step_diffs in zip(STEPS, tables_headed(report, "Candidate", "loss")[0::2],
                                           tables_headed(report, "Candidate", "loss")[1::2]):
        names = [f"grpo_{{}}_{steps}" + (f"_seed{seed}" if seed != 3407 else "") + ".json" for seed in seeds("hf_static")]
        refs = [stats.load(study / "results/stats" / n.format("hf")) for n in names]
        cands = [stats.load(study / "results/stats" / n.format("hf_static")) for n in names]
        for ref, cand in zip(refs, cands):
            assert [(s["loss"], s["reward"], s["kl"]) for s in cand["steps"]] == \
                [(s["loss"], s["reward"], s["kl"]) for s in ref["steps"]]
        for metric in verdict.METRICS:
            assert verdict.judge_runs(refs, cands, metric)["verdict"] == "equivalent"
        row = next(row for row in verdicts if row["Candidate"] == "hf_static")
        assert not any(row[m].startswith("divergent") for m in verdict.METRICS), row
        diffs = next(row for row in step_diffs if row["Candidate"] == "hf_static")
        assert all(diffs[m].startswith("0 (0) vs") for m in ("loss", "reward", "kl", "grad_norm")), diffs


def test_the_report_opens_with_its_answer_per_candidate(study):
    """Before any method: per candidate one decision from all its evidence, its rollout check, its trainer check and
    speed with its spread over the runs; hf_static's runs, hf's to the bit on the CPU, are said to be identical, every
    effect comes with its interval, and an open headline metric says what would decide it."""
    report = (study / "results/grpo_equivalence.md").read_text()
    assert report.index("## The answer") < report.index("## How to read it") < report.index("## Rollout check")
    answer = report[report.index("## The answer"):report.index("## How to read it")]
    rows = {row["Candidate"]: row for row in tables_headed(answer, "Candidate", "Decision")[0]}
    assert set(rows) == {"cb_paged", "hf_static"}
    for row in rows.values():
        assert row["Rollout at fixed weights"] != "not checked" and "sampler" in row["Rollout at fixed weights"]
        assert row["Trainer at fixed weights"] in ("computes the same step",) or "parts at" in row["Trainer at fixed weights"]
        assert re.match(r"\*\*(trains differently|trains as hf|not decided)\*\*", row["Decision"]), row
        assert " to " in row["Speed"] and "3 runs, CPU, beside other jobs" in row["Speed"]
    assert "(**identical runs** at" in rows["hf_static"]["Decision"]
    assert "**hf_static**: its runs are hf's to the bit" in answer
    if rows["cb_paged"]["Decision"].startswith("**not decided**"):
        assert re.search(r"\(-?[\d.]+x? to [+-]?[\d.]+x?\)", rows["cb_paged"]["Decision"])  # an effect's interval
        assert "- **cb_paged, " in answer and ", open**: " in answer


def test_report_step_differences_match_the_statistics(study):
    report = (study / "results/grpo_equivalence.md").read_text()
    step_tables = tables_headed(report, "Candidate", "loss")[1::2]
    assert len(step_tables) == len(STEPS)
    for rows, steps in zip(step_tables, STEPS):
        assert [row["Candidate"] for row in rows] == list(CANDIDATES)
        for candidate, row in zip(CANDIDATES, rows):
            ref, cand = load(study, "hf", steps)["steps"], load(study, candidate, steps)["steps"]
            for metric in ("loss", "reward", "kl", "grad_norm"):
                diff = [abs(c[metric] - r[metric]) for c, r in zip(cand, ref)]
                mean, largest, floor = re.match(r"(\S+) \((\S+)\) vs (\S+)", row[metric]).groups()
                assert float(mean) == pytest.approx(statistics.mean(diff), rel=1e-3, abs=1e-6)
                assert float(largest) == pytest.approx(max(diff), rel=1e-3, abs=1e-6)
                assert float(floor) > 0  # three reference seeds: a floor


def test_warnings_are_recorded_and_a_sampling_one_is_called_a_confound(study):
    report = (study / "results/grpo_equivalence.md").read_text()
    warned = load(study, "cb_paged", STEPS[0])["warnings"]
    assert any("MinPLogitsWarper might not be supported" in w["message"] and w["count"] == STEPS[0] for w in warned)
    assert "**Confound, cb_paged**" in report and "MinPLogitsWarper" in report
    assert "**hf**: none." in report


def test_figures_are_made_and_linked(study):
    report = (study / "results/grpo_equivalence.md").read_text()
    for steps in STEPS:
        figure = study / f"results/figures/curves_{steps}.png"
        assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 20_000
        assert f"](figures/curves_{steps}.png)" in report
    assert (study / "results/figures/speed_memory.png").exists() and "](figures/speed_memory.png)" in report


def test_snakemakes_html_report_holds_the_report_and_figures(study):
    out = study / "report.html"
    result = subprocess.run([*SNAKEMAKE, "--directory", str(study), "results/grpo_equivalence.md",
                             "--config", f"study={study / 'study.yaml'}", "--report", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    html = out.read_text()
    for name in ("grpo_equivalence.md", "curves_4.png", "curves_6.png", "speed_memory.png"):
        assert name in html
    assert "the reference's runs of every seed" in html  # a caption


def test_grpo_has_a_signal(study):
    """Primed, the tiny model's rewards vary within groups on most steps, or the comparison is empty."""
    for backend in ("hf", "cb_paged"):
        fractions = [s["metrics"]["frac_reward_zero_std"] for s in load(study, backend, max(STEPS))["steps"]]
        assert sum(f < 1 for f in fractions) > len(fractions) / 2, (backend, fractions)


def test_rerun_with_nothing_changed_runs_nothing(study):
    result = snakemake(study, "--dry-run")
    assert "Nothing to be done" in result.stdout + result.stderr


def test_grpo_report_cli_renders_the_same_tables(study):
    out = study / "cli_report.md"
    subprocess.run([sys.executable, "-c", "from grpo_equivalence.cli import report_main; report_main()",
                    "--stats-dir", str(study / "results/stats"), "--reference", "hf", "-o", str(out),
                    "--rollout", str(study / "results/rollout"), "--trainer", str(study / "results/trainer")], check=True)
    workflow_report = (study / "results/grpo_equivalence.md").read_text()
    cli_report = out.read_text()
    table = re.compile(r"^\| (hf|cb_paged|hf_static) .*$", re.M)
    assert table.findall(cli_report) and [m.group(0) for m in table.finditer(cli_report)] == \
        [m.group(0) for m in table.finditer(workflow_report)]


def test_lint_is_clean():
    result = subprocess.run([*SNAKEMAKE, "--lint", "--configfile", str(ROOT / "studies" / "tiny.yaml")],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_bad_config_stops_before_any_job(tmp_path):
    result = subprocess.run([*SNAKEMAKE, "--directory", str(tmp_path), "--cores", "1", "--configfile",
                             str(ROOT / "studies" / "tiny.yaml"), "--config", "reference=vllm"],
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "reference: 'vllm' is not among backends ['hf', 'cb_paged', 'hf_static']" in result.stdout + result.stderr
    assert not (tmp_path / "results").exists()


def test_the_study_plans_on_a_machine_without_gpu(tmp_path):
    """The default config.yaml (the GPU study) plans its DAG anywhere, e.g. on a login node."""
    result = subprocess.run([*SNAKEMAKE, "--directory", str(tmp_path), "--dry-run", "--cores", "1"],  # config.yaml: the default
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for backend in ("vllm", "unsloth_fi_false", "cb_paged"):
        for steps in (10, 30):
            assert f"results/stats/grpo_{backend}_{steps}.json" in out
    assert "prime" not in re.findall(r"^rule (\w+):", out, re.M)


def unrunnable_study(workdir: Path) -> Path:
    config = tiny_yaml()
    config["backends"] = ["hf", "unsloth_fi_false"]  # needs CUDA and Unsloth: neither is here
    path = workdir / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_backend_that_cannot_run_here_stops_the_workflow_before_any_job(tmp_path):
    result = subprocess.run([*SNAKEMAKE, "results/grpo_equivalence.md", "--directory", str(tmp_path), "--cores", "2",
                             "--configfile", str(unrunnable_study(tmp_path))], capture_output=True, text=True)
    assert result.returncode != 0
    assert "backend 'unsloth_fi_false' cannot run here" in result.stdout + result.stderr
    assert not (tmp_path / "results" / "logs").exists()  # no job started


def test_backend_that_cannot_run_fails_its_job_before_loading_the_model(tmp_path, tiny_into):
    """On a cluster the planning machine does not check (--no-hooks stands in): the job itself stops."""
    tiny_into(tmp_path)
    result = subprocess.run([*SNAKEMAKE, "results/stats/grpo_unsloth_fi_false_6.json", "--directory", str(tmp_path),
                             "--cores", "2", "--no-hooks", "--configfile", str(unrunnable_study(tmp_path))],
                            capture_output=True, text=True)
    assert result.returncode != 0
    log = (tmp_path / "results/logs/train/unsloth_fi_false_6.log").read_text()
    assert "backend 'unsloth_fi_false' cannot run here" in log
    assert "loading" not in log  # stopped before the model load
    assert not (tmp_path / "results/stats/grpo_unsloth_fi_false_6.json").exists()


def test_a_tracker_without_its_package_stops_the_workflow_before_any_job(tmp_path):
    """report_to: [wandb] where wandb is not installed: one line naming the tracker, its package and the fix,
    before any job starts (transformers would raise only once each job had built its trainer)."""
    import importlib.util

    assert importlib.util.find_spec("wandb") is None  # the test environment has no wandb
    config = tiny_yaml()
    config["grpo"]["report_to"] = ["wandb"]
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(config))
    result = subprocess.run([*SNAKEMAKE, "results/grpo_equivalence.md", "--directory", str(tmp_path), "--cores", "2",
                             "--configfile", str(tmp_path / "study.yaml")], capture_output=True, text=True)
    assert result.returncode != 0
    assert "grpo.report_to names wandb, whose package (wandb) is not installed" in result.stdout + result.stderr
    assert "pip install wandb, or drop wandb from report_to" in result.stdout + result.stderr
    assert not (tmp_path / "results" / "logs").exists()  # no job started
