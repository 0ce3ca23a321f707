"""The committed example reports are made of their committed statistics files."""

import re

import pytest

from conftest import ROOT
from grpo_equivalence.analysis import stats
from grpo_equivalence.analysis.summary import summarise
from grpo_equivalence.report.render import stats_files

EXAMPLES = sorted(p for p in (ROOT / "docs" / "examples").iterdir() if (p / "grpo_equivalence.md").exists())


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_report_rows_come_from_its_statistics(example):
    report = (example / "grpo_equivalence.md").read_text()
    tables = {int(n): body for n, body in re.findall(r"^## (\d+) steps\n(.*?)(?=^## )", report, re.M | re.S)}
    runs = [stats.load(p) for p in stats_files(example / "stats")]
    assert runs and {r["max_steps"] for r in runs} == set(tables)
    for run in [r for r in runs if r["seed"] == min(x["seed"] for x in runs)]:  # the speed table: the study's seed
        assert all(step["kl"] is not None for step in run["steps"])  # KL logged for every backend
        summary = summarise(run)
        if summary.get("gpu_alone") is False:  # packed beside other runs: its speed and memory are not shown
            row, peak = f"| {run['backend']} | shared GPU | shared GPU |", "| shared GPU |"
        else:
            row = f"| {run['backend']} | {summary['train_wall_s']:.1f} | {summary['median_step_s']:.3f} |"
            peak = f"| {summary['peak_mem_gb']:.2f} |"
        line = next((x for x in tables[run["max_steps"]].splitlines() if x.startswith(row)), None)
        assert line is not None and peak in line, row


def test_every_example_report_is_what_its_files_give_today():
    """Each committed report is today's report of its committed files (benchmarks/rerender_examples.py writes them
    again after the report changes)."""
    assert _benchmark("rerender_examples").main(["--check"]) == 0


def test_an_h200_example_has_vllm_as_reference_against_every_backend():
    from helpers import tables_headed

    example = ROOT / "docs" / "examples" / "h200-vllm-reference"
    report = (example / "grpo_equivalence.md").read_text()
    assert "Reference backend: **vllm**" in report
    runs = [stats.load(p) for p in stats_files(example / "stats")]
    candidates = {"unsloth_fi_false", "cb_paged", "hf", "hf_static", "trl_vllm"}
    assert {r["backend"] for r in runs} == candidates | {"vllm"}
    assert sorted(r["seed"] for r in runs if r["backend"] == "vllm") == [3407, 3408, 3409]  # the noise floor
    assert all(r["environment"]["gpu_name"] == "NVIDIA H200" for r in runs)
    verdicts = tables_headed(report, "Candidate", "loss")[0]
    assert {row["Candidate"] for row in verdicts} == candidates
    assert all(row[m] != "" for row in verdicts for m in ("loss", "reward", "kl", "grad_norm"))
    commits = {r["environment"]["git_commit"] for r in runs}
    assert len(commits) == 1 and commits.pop()[:7] in (example / "README.md").read_text()


def _benchmark(name: str):
    """A script of benchmarks/ as a module (the folder is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _performance_results(folder, readme) -> dict:
    """A folder's results.json, checked against what its runs give and against its table in `readme`."""
    import json

    import yaml

    module = _benchmark("performance_results")
    recomputed = module.results(folder / "stats", yaml.safe_load((folder / "study.yaml").read_text()))
    committed = json.loads((folder / "results.json").read_text())
    assert json.loads(stats.to_json(recomputed)) == committed
    assert module.markdown(committed) in readme.read_text()
    return committed


def test_performance_results_come_from_their_statistics():
    """docs/performance: results.json and the README's table are what the committed runs give."""
    folder = ROOT / "docs" / "performance"
    committed = _performance_results(folder, folder / "README.md")
    figures = committed["backends"]["qwen3-4b"]
    assert set(figures) == {"vllm", "unsloth_fi_false", "cb_paged", "hf", "hf_static", "trl_vllm"}
    for f in figures.values():
        for key in ("median_step_s", "rollout_s", "decode_ms_per_step", "rollout_tokens_per_s", "peak_device_gb"):
            assert isinstance(f[key], float) and f[key] > 0, key
    assert committed["bandwidth_floor_ms"] > 1 and committed["commit"]


@pytest.mark.parametrize("name, backends, commit", [("workflow-native", {"vllm", "native"}, "8f48144"),
                                                    ("workflow-native-batch64", {"vllm", "native"}, "8f48144"),
                                                    ("workflow-native-gc", {"native"}, "8f48144"),
                                                    ("workflow-native-gc-layerwise", {"native"}, "ca1d36e"),
                                                    ("workflow-native-layerwise", {"native"}, "ca1d36e")])
def test_the_native_backends_performance_figures_come_from_their_runs(name, backends, commit):
    """docs/performance's native runs: each results.json is what its runs give, its table is in the README, and
    the decode-step ratios the README states are those of the runs (at most 1.0 x vllm's at batch 4, 1.25 x at 64)."""
    import yaml

    folder = ROOT / "docs" / "performance" / name
    committed = _performance_results(folder, folder.parent / "README.md")
    study = yaml.safe_load((folder / "study.yaml").read_text())
    figures = committed["backends"]["qwen3-4b"]
    assert set(figures) == backends and committed["commit"] == [commit]
    if "vllm" in figures:
        ratio = figures["native"]["decode_ms_per_step"] / figures["vllm"]["decode_ms_per_step"]
        batch = study["grpo"]["per_device_train_batch_size"] * study["grpo"]["gradient_accumulation_steps"]
        assert ratio <= {4: 1.0, 64: 1.25}[batch]
        assert figures["native"]["startup_s"] <= 60
    if name == "workflow-native-gc-layerwise":  # gradient checkpointing and the merge written layer by layer
        assert figures["native"]["peak_device_gb"] <= 25


@pytest.mark.parametrize("batch", [4, 64])
def test_the_configurations_performance_figures_come_from_their_runs(batch):
    """docs/performance/configurations-h100: each batch's results.json is what its runs give, its table is in the
    README, and the README's figures for lean are those of the runs."""
    folder = ROOT / "docs" / "performance" / "configurations-h100" / f"batch{batch}"
    committed = _performance_results(folder, folder.parent.parent / "README.md")
    figures = committed["backends"]["qwen3-4b"]
    assert committed["commit"] == ["d75f459"]
    assert {"native", "native+lean"} <= set(figures)
    native, lean = figures["native"], figures["native+lean"]
    readme = " ".join((folder.parent.parent / "README.md").read_text().split())
    if batch == 64:
        assert f"({lean['median_training_s']:.2f} s against {native['median_training_s']:.2f} s a step)" in readme
        assert 1 - lean["median_training_s"] / native["median_training_s"] >= 0.195
        assert f"({lean['median_step_s']:.2f} s against {native['median_step_s']:.2f} s)" in readme
    else:
        assert lean["median_step_s"] <= native["median_step_s"]  # nothing slower at batch 4
        assert f"{lean['peak_device_gb']:.1f} GB on the device at batch 4" in readme
        assert figures["hf_static+lean"]["peak_device_gb"] <= 25 < lean["peak_device_gb"]


def test_rollout_checks_scored_before_the_rounding_band_are_kept_as_records_and_refused_as_evidence():
    """The committed rollout checks (the 4B native against hf, the H200 example) were scored by schema 1: every
    position counted, a raw-logit tolerance. Their files stay as what was measured; the check refuses to judge
    them again, saying how to make new ones."""
    from grpo_equivalence.analysis import stats
    from grpo_equivalence.checks import rollout

    folders = [ROOT / "docs" / "performance" / "rollout-native-4b" / "rollout",
               ROOT / "docs" / "examples" / "h200-vllm-reference" / "rollout"]
    paths = [p for folder in folders for p in sorted(folder.glob("*.json.gz"))]
    assert len(paths) > 2
    for path in paths:
        with pytest.raises(stats.StatsError, match="schema 1.*rerun its rollout_check job"):
            rollout.load(path)
    ref, cand = (stats.read_json(folders[0] / f"{b}.json.gz", what="rollout-check file", fix="") for b in ("hf", "native"))
    assert len(ref["completions"]) == len(cand["completions"]) == 512


def test_the_4b_rollout_check_rerun_at_its_plan_finds_native_drawing_outside_the_support_more_than_hf():
    """docs/performance/rollout-native-4b-rerun: the 4B check of native against hf with the rounding band, in one
    look. The plan is unreachable at these settings (temperature 0.1, min_p 0.5, bfloat16: the temperature faults
    act only where the rounding decides), so each side sampled one round; native draws 2.6 times hf's tokens
    clearly outside the support."""
    from grpo_equivalence.checks import power, rollout, rollout_verdict

    folder = ROOT / "docs" / "performance" / "rollout-native-4b-rerun" / "rollout"
    ref, cand = (rollout.load(folder / f"{b}.json.gz") for b in ("hf", "native"))
    assert ref["rounds"] == cand["rounds"] == 1 and ref["plan"]["tokens"] is None and ref["max_rounds"] == 4
    assert ref["dtype"] == "bfloat16" and ref["tolerance"] == 2.0 ** -6
    comparison = rollout_verdict.compare(ref, cand, alpha=0.05, support_margin=0.001, margin_sd=0.1)
    rollout_verdict.finalize([comparison], 0.05)
    clear = [sum(c["outside_clear"] for c in run["completions"]) for run in (ref, cand)]
    assert clear == [162, 420] and sum(c["tokens"] for c in ref["completions"]) == 131_072
    assert comparison["verdict"] == "divergent" and comparison["tests"]["support"]["p_value"] < 1e-20
    assert comparison["tests"]["score"]["verdict"] == rollout_verdict.NO_VARIATION
    kinds = {fault: planned["kind"] for fault, planned in ref["plan"]["faults"].items()}
    assert kinds["temperature_up"] == kinds["temperature_down"] == power.ROUNDING_ONLY
    assert kinds["no_min_p"] == power.DETECTABLE


def _fault_row(result: dict) -> tuple[list[str], str]:
    """A fault benchmark's JSON as docs/rollout-check.md's tables print it: the five cells and the rounds (tokens)."""
    from grpo_equivalence.checks import power

    reps = result["reps"]

    def cell(name):
        counts = result["counts"][name]
        shares = f"{100 * counts['divergent'] / reps:.0f} / {100 * counts['equivalent'] / reps:.0f} %"
        kinds = result["stated"][name]["kinds"]
        return shares if name == "control" or kinds == [power.DETECTABLE] else f"{kinds[0]} ({shares})"

    return ([cell(name) for name in ("control", "temperature_up", "temperature_down", "no_min_p", "no_top_k")],
            round(result["tokens_per_check"], -2))


def test_the_rollout_checks_table_on_the_model_of_256_rows_is_its_h200_files():
    """The second table of docs/rollout-check.md, cell for cell from docs/faults/h200-vocab256/*.json, and the
    fresh-seed rows its text quotes."""
    import json

    folder = ROOT / "docs" / "faults" / "h200-vocab256"
    table = (ROOT / "docs" / "rollout-check.md").read_text()
    names = {"tiny": "tiny sampling", "study": "`config.yaml`'s"}
    rows = 0
    for path in sorted(folder.glob("rollout-*-*-*.json")):
        if "seeds" in path.name:
            continue
        result = json.loads(path.read_text())
        backend, sampling, dtype = path.stem.split("-")[1:]
        cells, tokens = _fault_row(result)
        line = (f"| `{backend}`, {dtype}, {names[sampling]} | {result['reps']} | {result['rounds_per_check']:.1f} "
                f"({tokens:,.0f}) | {' | '.join(cells)} |")
        assert line in table, line
        assert result["gpu"] and result["shared_sessions"] and result["counts"]["control"]["divergent"] <= 1
        rows += 1
    assert rows == 6
    fresh = json.loads((folder / "rollout-hf-tiny-bfloat16-seeds30000.json").read_text())
    cpu = [json.loads((ROOT / "docs" / "faults" / f"rollout-cpu-tiny-{dtype}-plan90.json").read_text())
           for dtype in ("float32", "bfloat16")]
    for result, reps in ((fresh, 7), (cpu[0], 5), (cpu[1], 5)):
        assert result["reps"] == reps and result["counts"]["control"]["equivalent"] == reps
        assert all(result["counts"][f]["divergent"] == reps for f in result["counts"] if f != "control")
    text = " ".join(table.split())
    assert "confirmed the control in 7 of 7 whole repetitions and caught every fault in 7 of 7" in text


def test_the_rollout_checks_fault_table_is_its_h200_files():
    """docs/rollout-check.md's table of injected faults, cell for cell from docs/faults/h200/*.json; and the rates
    it claims: every fault the check states detectable divergent in at least 90 % of the reports, the control in
    at most one."""
    import json

    from grpo_equivalence.checks import power

    table = (ROOT / "docs" / "rollout-check.md").read_text()
    labels = {("tiny", "float32"): "float32, tiny sampling (T 1.0, min_p 0.05)", ("tiny", "bfloat16"): "bfloat16, tiny "
              "sampling", ("study", "float32"): "float32, `config.yaml`'s (T 0.1, min_p 0.5)",
              ("study", "bfloat16"): "bfloat16, `config.yaml`'s"}
    for (sampling, dtype), label in labels.items():
        result = json.loads((ROOT / "docs" / "faults" / "h200" / f"rollout-hf-{sampling}-{dtype}.json").read_text())
        reps = result["reps"]
        cells, tokens = _fault_row(result)
        rounds = f"{result['rounds_per_check']:.0f} ({tokens:,.0f})"
        assert f"| {label} | {reps} | {rounds} | {' | '.join(cells)} |" in table, (label, cells, rounds)
        assert result["counts"]["control"]["divergent"] <= 1 and result["gpu"] and result["temperature_margin"] == 0.1
        for name, stated in result["stated"].items():
            if stated["kinds"] == [power.DETECTABLE]:
                assert result["counts"][name]["divergent"] >= 0.9 * reps, (label, name)


def test_the_h200_rollout_check_covers_every_backend():
    from grpo_equivalence.analysis import stats

    example = ROOT / "docs" / "examples" / "h200-vllm-reference"
    checks = [stats.read_json(p, what="rollout-check file", fix="") for p in sorted((example / "rollout").glob("*.json.gz"))]
    backends = {c["backend"] for c in checks if c["fault"] is None}
    assert backends == {"vllm", "unsloth_fi_false", "cb_paged", "hf", "hf_static", "trl_vllm"}
    assert all(c["environment"]["gpu_name"] == "NVIDIA H200" for c in checks)
    # the vLLM backends report their own log-probabilities: the mismatch is there, and only there
    assert {c["backend"] for c in checks if c["mismatch"]} == {"vllm", "trl_vllm", "vllm+temperature_up",
                                                                 "trl_vllm+no_min_p"}


@pytest.mark.parametrize("name", ["h200-packed-study", "h200-packed-study-12seeds", "h200-packed-study-decides"])
def test_a_packed_h200_example_holds_its_paired_seeds_and_its_figures_come_from_them(name):
    """docs/examples/h200-packed-study*: the runs (every backend at each of the study's seeds), which of them had
    the GPU alone (the study's seed, unless the speed runs were packed too), and packing.json recomputed from the
    committed statistics, job logs and Snakemake's log."""
    import json

    import yaml

    example = ROOT / "docs" / "examples" / name
    study = yaml.safe_load((example / "study.yaml").read_text())
    seed, count = study["grpo"]["seed"], study["replicates"]["reference"]
    assert study["replicates"]["others"] == count >= 8
    runs = [stats.load(p) for p in stats_files(example / "stats")]
    seeds = {}
    for run in runs:
        seeds.setdefault(run["backend"], []).append(run["seed"])
        lease = run["environment"]["gpu_lease"]
        alone = run["seed"] == seed and study["gpu_sharing"]["speed_runs"] != "packed"
        assert lease["whole"] == alone and (lease["shared_with"] == []) == alone
    assert {b: sorted(s) for b, s in seeds.items()} == {b: list(range(seed, seed + count)) for b in (
        "vllm", "unsloth_fi_false", "cb_paged", "hf", "hf_static", "trl_vllm")}
    module = _benchmark("packing_results")
    recomputed = module.main([str(example)])
    assert json.loads(json.dumps(recomputed)) == json.loads((example / "packing.json").read_text())
    readme = (example / "README.md").read_text()
    assert f"{recomputed['makespan_s']} s" in readme
    assert ("speedup_per_run" in recomputed) == (study["gpu_sharing"]["speed_runs"] != "packed")
    if "speedup_per_run" in recomputed:
        assert f"**{recomputed['speedup_per_run']:.1f}x**" in readme
    decided = recomputed["decided"]
    n = decided["equivalent"] + decided["divergent"]
    assert f"{n} {'is' if n == 1 else 'are'} decided ({decided['share']:.0%})" in readme


def test_the_lean_configurations_example_is_its_runs_own(tmp_path):
    """docs/examples/h100-lean-equivalence: native+lean against native on seeds no other example ran, packing.json
    recomputed from the committed files, the report's verdicts those the README states, and its trainer check the
    one the README explains: every quantity identical, as the check then ran without Liger's kernels."""
    import json

    from helpers import tables_headed

    from grpo_equivalence import cli

    example = ROOT / "docs" / "examples" / "h100-lean-equivalence"
    recomputed = _benchmark("packing_results").main([str(example), "--reference", "native"])
    assert json.loads(json.dumps(recomputed)) == json.loads((example / "packing.json").read_text())
    runs = [stats.load(p) for p in stats_files(example / "stats")]
    assert sorted((r["backend"], r["seed"]) for r in runs) == sorted(
        (b, s) for b in ("native", "native+lean") for s in range(5201, 5213))
    assert {r["environment"]["git_commit"] for r in runs} == {"d75f459"}
    for other in (ROOT / "docs" / "examples").glob("*/stats"):
        if other.parent != example:
            assert not set(range(5201, 5213)) & {stats.load(p)["seed"] for p in stats_files(other)}, other
    report = (example / "grpo_equivalence.md").read_text()
    verdicts = tables_headed(report, "Candidate", "loss")[0]
    out = tmp_path / "report.md"
    cli.report_main(["--stats-dir", str(example / "stats"), "--reference", "native", "--rollout", str(example / "rollout"),
                     "--trainer", str(example / "trainer"), "-o", str(out)])
    again = out.read_text()
    for first in (("Candidate", "loss"), ("Candidate", "Decision"), ("Backend", "Where it parts from native")):
        assert tables_headed(report, *first) and tables_headed(again, *first) == tables_headed(report, *first), first
    said = {m: v.split(":")[0] for m, v in verdicts[0].items()}
    assert said == {"Candidate": "native+lean", "loss": "equivalent", "reward": "equivalent", "kl": "open",
                    "grad_norm": "equivalent", "completion_length": "equivalent", "entropy": "equivalent"}
    assert verdicts[0]["kl"].startswith("open: 0.59x (")  # the effect, with its interval
    comparison = json.loads((example / "trainer" / "native+lean_vs_native.json").read_text())
    assert all(q["difference"] == 0 for q in comparison["quantities"].values())
    first = {r["backend"]: r["steps"][0]["grad_norm"] for r in runs if r["seed"] == 5201}
    readme = (example / "README.md").read_text()
    assert first["native"] != first["native+lean"]  # training did run Liger's kernels
    assert f"({first['native+lean']:.4f} against {first['native']:.4f})" in readme
    assert f"{recomputed['makespan_s']} s" in " ".join(readme.split())


def test_same_runs_finds_a_run_whose_training_numbers_changed(tmp_path):
    """benchmarks/same_runs.py on the packed example against a copy of it with one step's loss changed."""
    import gzip
    import json
    import shutil

    example = ROOT / "docs" / "examples" / "h200-packed-study-12seeds" / "stats"
    copy = tmp_path / "stats"
    shutil.copytree(example, copy)
    changed = copy / "grpo_hf_30_seed3422.json.gz"
    run = json.loads(gzip.decompress(changed.read_bytes()))
    run["steps"][5]["loss"] += 1e-9
    changed.write_bytes(gzip.compress(json.dumps(run).encode()))
    module = _benchmark("same_runs")
    result = module.main([str(example), str(copy)])
    assert result["shared_runs"] == 72 and result["differ"] == ["hf x 30 seed 3422"]


def test_decided_share_of_every_seed_of_an_example_is_the_examples_own():
    """benchmarks/decided_share.py, drawing all twelve seeds of the deciding example, decides what its
    packing.json says (the same judgment, from the same runs)."""
    import json

    example = ROOT / "docs" / "examples" / "h200-packed-study-decides"
    result = _benchmark("decided_share").main([str(example / "stats"), "--seeds", "12", "--draws", "1"])
    assert result[12]["mean_share"] == json.loads((example / "packing.json").read_text())["decided"]["share"] == 7 / 15


def test_the_fresh_seed_example_of_the_new_verdict_is_its_runs_own():
    """docs/examples/h200-fresh-seeds-verdict: seeds no other example ran, packing.json recomputed from the
    committed runs, and the README's decided cells those of the current verdict."""
    import json

    example = ROOT / "docs" / "examples" / "h200-fresh-seeds-verdict"
    recomputed = _benchmark("packing_results").main([str(example), "--reference", "unsloth_fi_false"])
    assert json.loads(json.dumps(recomputed)) == json.loads((example / "packing.json").read_text())
    decided = recomputed["decided"]
    assert (decided["cells"], decided["divergent"], decided["equivalent"]) == (9, 7, 0)
    assert "**7 are decided (78%)**" in (example / "README.md").read_text()
    seeds = {stats.load(p)["seed"] for p in stats_files(example / "stats")}
    assert seeds == set(range(3451, 3463))
    for other in (ROOT / "docs" / "examples").glob("h200-packed-study*/stats"):
        assert not seeds & {stats.load(p)["seed"] for p in stats_files(other)}, other


def test_the_second_twenty_repetitions_of_the_bfloat16_row_are_quoted_as_their_files_say():
    """docs/rollout-check.md pools the tiny bfloat16 row's two sets of twenty repetitions (first seeds 10000 and
    20000): temperature_down's equivalent calls and the control's, from both files."""
    import json

    h200 = ROOT / "docs" / "faults" / "h200"
    rows = [json.loads((h200 / f"rollout-hf-tiny-bfloat16{suffix}.json").read_text()) for suffix in ("", "-seeds20000")]
    reps = sum(r["reps"] for r in rows)
    cold = sum(r["counts"]["temperature_down"]["equivalent"] for r in rows)
    control = sum(r["counts"]["control"]["equivalent"] for r in rows)
    text = " ".join((ROOT / "docs" / "rollout-check.md").read_text().split())
    assert reps == 40 and f"equivalent {cold} times ({100 * cold / reps:.1f} %" in text
    assert f"control confirmed in {control} ({100 * control / reps:.1f} %)" in text
    assert all(r["counts"]["control"]["divergent"] == 0 and r["gpu"] for r in rows)


@pytest.mark.parametrize("name", ["fault_detection", "fault_detection_training"])
def test_a_fault_benchmark_the_docs_quote_starts(name):
    """Its options parse (both parsers defining --gpu once stopped the training benchmark at its start)."""
    import subprocess
    import sys

    script = ROOT / "benchmarks" / f"{name}.py"
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--gpu" in result.stdout, result.stderr[-2000:]


def test_vllms_top_p_kernel_drops_what_the_docs_say_at_the_tiny_models_logits():
    """docs/backends.md's table and docs/rollout-check.md's figures of vLLM 0.26's top-p kernel are those of
    docs/faults/vllm-nucleus-*.json: it only ever drops tokens, its correct sampler is colder than the settings, and
    it cuts most of the tokens a hotter sampler would draw outside the settings' support."""
    import json

    backends = " ".join((ROOT / "docs" / "backends.md").read_text().split())
    checks = " ".join((ROOT / "docs" / "rollout-check.md").read_text().split())
    for sampling in ("tiny", "study"):
        result = json.loads((ROOT / "docs" / "faults" / f"vllm-nucleus-{sampling}.json").read_text())
        kept, expected = result["kept"]["correct"], result["expected"]["correct"]
        assert result["vllm"] == "0.26.0" and all(k["kernel_adds"] == 0 for k in result["kept"].values())
        row = (f"| {result['positions']:,} | {100 * kept['several_kept']:.1f} % | {100 * kept['only_top_kept']:.1f} % "
               f"{'of all positions ' if sampling == 'tiny' else ''}| {100 * kept['differs']:.1f} % | "
               f"+{expected['kernel']['score']:.3f} a token |")
        assert row in backends, row
        assert expected["kernel"]["score"] > 0 and abs(expected["exact"]["score"]) < 1e-4
    tiny = json.loads((ROOT / "docs" / "faults" / "vllm-nucleus-tiny.json").read_text())
    hot = tiny["expected"]["temperature_up"]
    assert f"{hot['kernel']['outside']:.5f}" in checks and f"{hot['exact']['outside']:.5f}" in checks
    assert hot["kernel"]["outside"] < hot["exact"]["outside"] / 2
    # without top_p the kernel filters top_k alone, and keeps what the exact filters keep everywhere
    without = json.loads((ROOT / "docs" / "faults" / "vllm-nucleus-tiny-top_p1.json").read_text())
    assert without["sampling"]["top_p"] == 1.0 and "--top-p 1.0" in " ".join(
        (ROOT / "docs" / "backends.md").read_text().split())
    assert all(k["differs"] == 0 for k in without["kept"].values())
    # the benchmark's statement of the kernel's rule keeps, position by position, what the kernel keeps
    for name in ("tiny", "study", "tiny-top_p1"):
        result = json.loads((ROOT / "docs" / "faults" / f"vllm-nucleus-{name}.json").read_text())
        assert all(k["stand_in_differs"] == 0 for k in result["kept"].values()), name


def test_a_sampler_with_the_kernels_rule_hides_temperature_errors_in_bfloat16_as_the_docs_say():
    """docs/rollout-check.md and docs/faults/README.md on the CPU rows with hf filtering by vLLM 0.26's kernel rule:
    in bfloat16 the temperature faults mostly escape (the support test never sees temperature_up), in float32 not."""
    import json

    faults_doc = " ".join((ROOT / "docs" / "faults" / "README.md").read_text().split())
    rows = {dtype: json.loads((ROOT / "docs" / "faults" / f"rollout-cpu-tiny-{dtype}-kernel-rule.json").read_text())
            for dtype in ("float32", "bfloat16")}
    exact = {dtype: json.loads((ROOT / "docs" / "faults" / f"rollout-cpu-tiny-{dtype}-plan90.json").read_text())
             for dtype in ("float32", "bfloat16")}
    for dtype, row in rows.items():
        assert row["kernel_rule"] and row["reps"] == 5 and row["counts"]["control"]["equivalent"] == 5
        assert all(exact[dtype]["counts"][f]["divergent"] == 5 for f in ("temperature_up", "temperature_down"))
    assert all(rows["float32"]["counts"][f]["divergent"] == 5 for f in ("temperature_up", "temperature_down"))
    bf16 = rows["bfloat16"]
    up, down = bf16["counts"]["temperature_up"], bf16["counts"]["temperature_down"]
    assert bf16["divergent_by_test"]["temperature_up"]["support"] == 0
    assert f"`temperature_up` divergent {up['divergent']} of 5" in faults_doc
    assert f"`temperature_down` divergent {down['divergent']}, equivalent {down['equivalent']}" in faults_doc


def test_the_filter_orders_agree_at_the_tiny_models_logits_as_the_docs_say():
    """docs/rollout-check.md rules out the filters' order as why the vLLM path missed temperature errors, on the
    figures of docs/faults/filter-order-*.json: per sampler, vLLM's order and transformers' to four decimals."""
    import json

    text = " ".join((ROOT / "docs" / "rollout-check.md").read_text().split())
    for sampling in ("tiny", "study"):
        result = json.loads((ROOT / "docs" / "faults" / f"filter-order-{sampling}.json").read_text())
        assert f"{result['positions']:,}" in text
        for sampler in result["expected"].values():
            for key in ("score", "outside"):
                assert abs(sampler["vllm"][key] - sampler["transformers"][key]) < 5e-5, (sampling, sampler)
        assert result["fault_effects"]["temperature_down"]["vllm"]["score"] > 0  # the effect is there, in both


def test_the_rollout_checks_rows_are_their_files():
    """docs/rollout-check.md's tables of the sampler judged on its own logits, the CPU's and the GPU's: each row's
    divergent / equivalent shares, candidate by candidate (those the backend injects), are those of its file in
    docs/faults/cpu-exact/ or gpu-exact/, with the repetitions the row says."""
    import json
    import re

    lines = (ROOT / "docs" / "rollout-check.md").read_text().splitlines()
    rows = {("cpu-exact", "rollout-cpu-tiny-float32"): "| T 1.0, min_p 0.05 (tiny), float32 |",
            ("cpu-exact", "rollout-cpu-tiny-bfloat16"): "| T 1.0, min_p 0.05, bfloat16 |",
            ("cpu-exact", "rollout-cpu-study-bfloat16"): "| T 0.1, min_p 0.5 (`config.yaml`'s), bfloat16 |",
            ("gpu-exact", "rollout-hf-tiny-bfloat16"): "| `hf`, T 1.0, min_p 0.05 (tiny) | H200 | 20 |",
            ("gpu-exact", "rollout-hf-study-bfloat16"): "| `hf`, T 0.1, min_p 0.5 (`config.yaml`'s) | H200 | 2 |",
            ("gpu-exact", "rollout-hf-study-bfloat16-h100"): "| `hf`, T 0.1, min_p 0.5, 2026-12-07 | H100 | 21 |",
            ("gpu-exact", "rollout-trl_vllm-study-bfloat16"): "| `trl_vllm`, T 0.1, min_p 0.5 | H100 | 1 |",
            ("gpu-exact", "rollout-trl_vllm-study-bfloat16-exact_top_p"):
                "| `trl_vllm` with `exact_top_p: true`, the same | H100 | 1 |",
            ("gpu-exact", "rollout-trl_vllm-study-bfloat16-exact_top_p-repointed"):
                "| `trl_vllm` with `exact_top_p: true` repointed, the same | H100 | 1 |"}
    columns = ("reference", "control", "temperature_up", "temperature_down", "no_min_p", "no_top_k", "drop_weakest",
               "fp8_rollout")
    for (folder, name), label in rows.items():
        result = json.loads((ROOT / "docs" / "faults" / folder / f"{name}.json").read_text())
        reps = result["reps"]
        assert result["gpu"] == (folder == "gpu-exact") and (reps == 20 or folder == "gpu-exact"), name
        [row] = [line for line in lines if line.startswith(label)]
        shown = re.findall(r"(\d+) / (\d+) %", row)
        wanted = [(str(round(100 * result["counts"][c]["divergent"] / reps)),
                   str(round(100 * result["counts"][c]["equivalent"] / reps))) for c in columns if c in result["counts"]]
        assert shown == wanted, (name, shown, wanted)
    readme = (ROOT / "README.md").read_text().splitlines()  # its table: the tiny sampling's rows, without the reference
    for where, folder, name in (("CPU", "cpu-exact", "rollout-cpu-tiny-float32"),
                                ("CPU", "cpu-exact", "rollout-cpu-tiny-bfloat16"),
                                ("H200", "gpu-exact", "rollout-hf-tiny-bfloat16")):
        result = json.loads((ROOT / "docs" / "faults" / folder / f"{name}.json").read_text())
        dtype = name.rsplit("-", 1)[1]
        [row] = [line for line in readme if line.startswith(f"| {where} | T 1.0, min_p 0.05") and f", {dtype} |" in line]
        wanted = [(str(round(100 * result["counts"][c]["divergent"] / 20)),
                   str(round(100 * result["counts"][c]["equivalent"] / 20))) for c in columns[1:]]
        assert re.findall(r"(\d+) / (\d+) %", row) == wanted, (where, name)


def test_a_failed_check_drops_its_repetition_not_the_fault_benchmarks_row(tmp_path, monkeypatch):
    """One check that fails (here: a backend that does not exist) is named with its error and its repetition left
    out; the row goes on with the others (on an H200 one of sixteen vLLM engines once lost its port and, with it, the
    whole row)."""
    import argparse
    import sys
    import time

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # as the script runs: its workers import it by name
    import fault_detection

    args = argparse.Namespace(reps=1, jobs=1, deadline=None, resume=False)
    job = ("no_such_backend", 7, tmp_path / "check.json", {}, 1, True)
    files, failed = fault_detection._run_all([job], args, time.perf_counter())
    assert files == [] and len(failed) == 1, failed
    assert failed[0]["backend"] == "no_such_backend" and failed[0]["seed"] == 7
    assert "no_such_backend" in failed[0]["error"] and "Pickl" not in failed[0]["error"], failed
    sys.modules.pop("fault_detection", None)


def test_rows_of_one_setting_run_at_other_seeds_join_and_others_are_refused(monkeypatch):
    """A row one GPU session could not finish is run again at other seeds and joined (--merge): counts summed, the
    repetitions renumbered, the statements' medians over both; rows of other settings, other commits or
    overlapping seeds are refused, since a repetition counted twice or judged otherwise would change the rates."""
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import fault_detection

    def row(first_seed, reps, divergent, commit="abc"):
        settings = dict.fromkeys(fault_detection._SAME, 1)
        return {**settings, "reps": reps, "first_seed": first_seed, "environment": {"git_commit": commit},
                "counts": {"control": {"divergent": divergent, "equivalent": reps - divergent, "inconclusive": 0}},
                "divergent_by_test": {"control": {"score": divergent}},
                "checks": [{"rep": r, "candidate": "control"} for r in range(reps)], "failed_checks": [],
                "stated_rows": {"temperature_up": [{"kind": "score", "power": 0.5 + r / 10, "tokens_needed": 1000}
                                                   for r in range(reps)]},
                "tokens_per_check": 100.0 * reps, "rounds_per_check": 2.0}

    joined = fault_detection.merge([row(1000, 2, 1), row(2000, 3, 0)])
    assert joined["reps"] == 5 and joined["counts"]["control"] == {"divergent": 1, "equivalent": 4, "inconclusive": 0}
    assert [c["rep"] for c in joined["checks"]] == [0, 1, 0 + 2, 1 + 2, 2 + 2]
    assert joined["stated"]["temperature_up"]["median_power"] == 0.6 and joined["first_seed"] == [1000, 2000]
    assert joined["tokens_per_check"] == (200 * 2 + 300 * 3) / 5
    for bad, says in ((row(1100, 1, 0), "overlap"), (row(3000, 1, 0, commit="def"), "environment.git_commit"),
                      ({**row(3000, 1, 0), "dtype": "float32"}, "dtype")):
        with pytest.raises(SystemExit, match=says):
            fault_detection.merge([row(1000, 2, 1), bad])
    across = fault_detection.merge([row(1000, 2, 1), row(3000, 1, 0, commit="def")], across_commits=True)
    assert across["reps"] == 3 and across["git_commits"] == ["abc", "def"]
    # a joined row joins again, each call's seeds kept: a later call's overlap is still refused
    again = fault_detection.merge([across, row(4000, 2, 2, commit="ghi")], across_commits=True)
    assert again["reps"] == 5 and again["first_seed"] == [1000, 3000, 4000]
    assert again["git_commits"] == ["abc", "def", "ghi"] and again["counts"]["control"]["divergent"] == 3
    with pytest.raises(SystemExit, match="overlap"):
        fault_detection.merge([across, row(1100, 1, 0)], across_commits=True)
    with pytest.raises(SystemExit, match="join the rows it was made of"):
        fault_detection.merge([{k: v for k, v in across.items() if k != "parts"}, row(4000, 1, 0)])
    with pytest.raises(SystemExit, match="run it again"):
        fault_detection.merge([row(1000, 2, 1), {k: v for k, v in row(3000, 1, 0).items() if k != "first_seed"}])
    sys.modules.pop("fault_detection", None)


def test_the_trainer_checks_false_flag_tables_are_their_runs():
    """docs/trainer-check.md's tables of real trainer checks are benchmarks/trainer_false_flags.py's of its files:
    ten or twenty fresh seeds, three correct candidates (four on the H100) and two faults each, in both precisions;
    today's rule's on the CPU at the benchmark's own first seed, the H100's at the first seed of each call."""
    import json

    module = _benchmark("trainer_false_flags")
    text = (ROOT / "docs" / "trainer-check.md").read_text()
    for name, dtype, seeds, first in (("trainer-false-flags-cpu-seeds5051", "float32", 10, module.FIRST_SEED),
                                      ("trainer-false-flags-cpu-bfloat16-seeds5051", "bfloat16", 10, module.FIRST_SEED),
                                      ("trainer-false-flags-h100-bfloat16", "bfloat16", 10, 5011),
                                      ("trainer-false-flags-h100-bfloat16-seeds5031", "bfloat16", 10, 5031),
                                      ("trainer-false-flags-h100-bfloat16-seeds5041", "bfloat16", 10, 5041),
                                      ("trainer-false-flags-h100-bfloat16-seeds5051", "bfloat16", 20, 5051)):
        result = json.loads((ROOT / "docs" / "faults" / f"{name}.json").read_text())
        assert result["dtype"] == dtype and result["seeds"] == seeds and result["first_seed"] == first
        candidates = 3 if name.startswith("trainer-false-flags-cpu") else 4
        assert len(result["comparisons"]) == seeds * (len(result["candidates"]) + len(result["faults"])) == \
            seeds * (candidates + 2)
        assert module.runs_table(result) in text and module.faults_table(result) in text, name
    # today's rule: no correct candidate flagged, on the CPU or at the H100's fresh seeds (Liger's kernels among
    # them), and each fault named where it acts at every seed but where the loss's values cannot tell it (a doubled
    # loss whose policy term is zero reads as a doubled KL term)
    for name in ("trainer-false-flags-cpu-seeds5051", "trainer-false-flags-cpu-bfloat16-seeds5051",
                 "trainer-false-flags-h100-bfloat16-seeds5051"):
        result = json.loads((ROOT / "docs" / "faults" / f"{name}.json").read_text())
        assert result["factor"] == module.trainer_verdict.FACTOR
        assert not any(c["first"] for c in result["comparisons"] if c["candidate"] in result["candidates"])
        for c in (c for c in result["comparisons"] if c["candidate"] in module.FAULTS):
            untold = c["candidate"] == "hf+loss_x2" and c["quantities"]["policy_term"]["difference"] == 0.0
            assert c["first"] == module.FAULTS[c["candidate"]] or (untold and c["first"] == "kl_term"), c["seed"]


def test_the_lean_examples_trainer_check_with_liger_is_its_files():
    """docs/examples/h100-lean-equivalence's trainer check with Liger's kernels: the files say what the README says,
    every quantity within its floor but not the same bits (a check that compared the same numbers would give 0)."""
    import json

    example = ROOT / "docs" / "examples" / "h100-lean-equivalence"
    readme = " ".join((example / "README.md").read_text().split())
    result = json.loads((example / "trainer-with-liger" / "native+lean_vs_native.json").read_text())
    quantities = result["quantities"]
    assert result["first"] is None and not any(q["differs"] for q in quantities.values())
    for name, text in (("policy_logps", "policy log-probabilities differ by {:.4f} (floor {:.4f})"),
                       ("reference_logps", "the reference's by {:.4f} ({:.4f})"),
                       ("gradient", "the gradient by {:.3f} ({:.3f}")):
        q = quantities[name]
        assert q["difference"] > 0 and text.format(q["difference"], q["floor"]) in readme, name
    assert f"cosine {quantities['gradient']['cosine']:.5f}" in readme


def test_the_margin_edge_table_on_synthetic_own_logits_is_its_file():
    """docs/rollout-check.md's table of the score test at the margin's edge on synthetic own logits is
    benchmarks/rollout_calibration.py --own's file, and that file holds the rate the test claims there: a sampler
    10 % too hot called equivalent at most about alpha (5 %) of the time, its z at the edge mean 0 and SD 1."""
    import json

    result = json.loads((ROOT / "docs" / "faults" / "rollout-synthetic-own-study-margin-edge.json").read_text())
    text = (ROOT / "docs" / "rollout-check.md").read_text()
    assert result["own"] and result["settings"]["temperature"] == 0.1 and result["settings"]["min_p"] == 0.5
    for r in result["rows"]:
        line = (f"| {r['dtype']} | {r['sampler']} | {r['divergent']}/{r['reps']} | {r['equivalent']}/{r['reps']} | "
                f"{r['edge_z_mean']:.3f}, {r['edge_z_sd']:.3f} |")
        assert line in text, line
        assert abs(r["edge_z_mean"]) < 0.15 and 0.9 < r["edge_z_sd"] < 1.1, r
    hot = next(r for r in result["rows"] if r["sampler"] == "temperature_up")
    assert hot["equivalent"] / hot["reps"] <= 0.065, hot
