import re

import pytest

from grpo_equivalence import cli
from grpo_equivalence.analysis import sequential, stats
from grpo_equivalence.report.render import from_stats_dir
from helpers import make_stats, tables_headed


@pytest.fixture
def stats_dir(tmp_path):
    for steps in (5, 8):
        stats.write(tmp_path / f"grpo_vllm_{steps}.json", make_stats("vllm", steps, wall=lambda i: 2.0))
        stats.write(tmp_path / f"grpo_cb_paged_{steps}.json",
                    make_stats("cb_paged", steps, wall=lambda i: 4.0, reward=lambda i: i + 0.25, kl=lambda i: None))
    return tmp_path


def test_one_table_per_step_count_with_percent_of_reference(stats_dir):
    text = from_stats_dir(stats_dir, "vllm")
    assert re.findall(r"^## (\d+) steps$", text, re.M) == ["5", "8"]
    speed = tables_headed(text, "Backend", "Train wall (s)")
    assert len(speed) == 2
    assert [t[0]["% of vllm"] for t in speed] == ["100.0 %", "100.0 %"]
    cb = speed[0][1]
    assert [cb[k] for k in ("Backend", "Train wall (s)", "Median step (s)", "Peak mem (GB)", "% of vllm")] == \
        ["cb_paged", "50.0", "4.000", "1.05", "50.0 % (one run alone: spread not measured)"]
    assert cb["Start-up (s)"] == "not recorded"  # an optional field these files lack
    assert cb["Warm-up steps (s)"] == "12.0"  # steps 1..3 at 4 s


def test_speed_has_one_basis_and_is_ranked_only_where_the_runs_spreads_part():
    """The answer's and the speed table's % come from one basis, the median over the runs that had their device alone;
    two backends whose runs' ranges overlap are "too noisy to rank", and CPU runs say they ran beside others."""
    from grpo_equivalence.analysis.summary import step_speed

    def runs(backend, seconds, gpu=True):
        found = []
        for i, s in enumerate(seconds):
            run = make_stats(backend, 6, seed=1 + i, wall=lambda _, s=s: s)
            run["environment"]["gpu_count"] = 1 if gpu else 0
            found.append(run)
        return found

    base = step_speed(runs("vllm", [1.0, 1.1, 1.2]), 3)
    assert base["median"] == pytest.approx(1.1) and (base["low"], base["high"], base["runs"]) == (1.0, 1.2, 3)
    fast = step_speed(runs("native", [0.5, 0.55]), 3, base)
    assert fast["rank"] == "faster" and fast["pct_of_reference"] == pytest.approx(100 * 1.1 / 0.525)
    assert step_speed(runs("hf", [0.9, 1.15]), 3, base)["rank"] == "too noisy to rank"
    assert step_speed(runs("hf", [2.0]), 3, base)["rank"] == "one run alone: spread not measured"
    assert step_speed(runs("hf", [2.0], gpu=False), 3)["cpu"] and not base["cpu"]


def test_startup_and_vllm_reservation_are_shown_for_what_they_are(tmp_path):
    for backend, fraction in (("vllm", 0.3), ("hf", None)):
        run = make_stats(backend, 5)
        run["startup_s"] = 110.0 if fraction else 4.0
        run["environment"]["gpu_memory_gb"] = 150.0
        run["effective_config"]["trainer"].update(use_vllm=fraction is not None, vllm_gpu_memory_utilization=fraction or 0.3)
        stats.write(tmp_path / f"grpo_{backend}_5.json", run)
    text = from_stats_dir(tmp_path, "vllm")
    (speed,) = tables_headed(text, "Backend", "Train wall (s)")
    assert {r["Backend"]: r["Start-up (s)"] for r in speed} == {"vllm": "110.0", "hf": "4.0"}
    (memory,) = tables_headed(text, "Backend", "Device in use (peak)")
    reservation = {r["Backend"]: r["of which vLLM's up-front reservation"] for r in memory}
    assert reservation == {"vllm": "45.00", "hf": "none (no vLLM)"}
    assert "those gigabytes are a setting, not what the" in text


def test_pairwise_table_reports_not_logged_never_zero(stats_dir):
    text = from_stats_dir(stats_dir, "vllm")
    verdicts, steps = tables_headed(text, "Candidate", "loss")[:2]  # 5 steps: verdicts, then step by step
    memory = tables_headed(text, "Backend", "Device in use (peak)")[0][1]
    assert list(memory.values()) == ["cb_paged", "1.05", "none (no vLLM)", "not logged", "not logged"]  # no CUDA here
    assert verdicts[0]["kl"] == "not logged" and steps[0]["kl"] == "not logged"
    # one run each: no noise floor, so no verdict but open, and the step table has no floor either; one word for an
    # open verdict across the report
    assert verdicts[0]["reward"].startswith("open")
    assert "inconclusive" not in text
    assert steps[0]["reward"] == "0.25 (0.25) vs no floor" and steps[0]["loss"] == "0 (0) vs no floor"


def test_report_lists_the_raw_statistics_and_settings(stats_dir):
    text = from_stats_dir(stats_dir, "vllm")
    assert f"`{stats_dir / 'grpo_cb_paged_8.json'}`" in text
    assert "| beta | 0.001 |" in text


def test_reference_missing_is_an_error(stats_dir):
    with pytest.raises(stats.StatsError, match="no run of reference backend 'hf'"):
        from_stats_dir(stats_dir, "hf")


def test_cli_report_writes_and_refuses_to_overwrite(stats_dir, tmp_path, capsys):
    out = tmp_path / "out" / "report.md"
    cli.report_main(["--stats-dir", str(stats_dir), "--reference", "vllm", "-o", str(out)])
    assert out.read_text() == from_stats_dir(stats_dir, "vllm")
    with pytest.raises(SystemExit, match="exists; pass --force"):
        cli.report_main(["--stats-dir", str(stats_dir), "--reference", "vllm", "-o", str(out)])


def test_cli_summarise_and_compare(stats_dir, capsys):
    cli.summarise_main([str(stats_dir / "grpo_cb_paged_5.json")])
    assert '"median_step_s": 4.0' in capsys.readouterr().out
    cli.compare_main(["--ref", str(stats_dir / "grpo_vllm_5.json"), "--candidate", str(stats_dir / "grpo_cb_paged_5.json")])
    assert '"status": "not logged"' in capsys.readouterr().out


def test_cli_error_is_one_line_with_the_fix(tmp_path):
    with pytest.raises(SystemExit, match="no statistics files"):
        cli.report_main(["--stats-dir", str(tmp_path), "--reference", "vllm"])


def test_settings_that_differ_between_backends_are_listed(tmp_path):
    for backend, gc in (("vllm", True), ("hf", False)):
        run = make_stats(backend, 5)
        run["effective_config"] = {"trainer": {"beta": 0.001, "gradient_checkpointing": gc, "max_steps": 5}, "lora": None}
        stats.write(tmp_path / f"grpo_{backend}_5.json", run)
    text = from_stats_dir(tmp_path, "vllm")
    section = text.split("## Settings that differ between backends")[1].split("## Study settings")[0]
    assert "| Setting | hf | vllm |" in section
    assert "| trainer.gradient_checkpointing | False | True |" in section
    assert "beta" not in section and "max_steps" not in section


def test_generation_settings_a_backend_sets_on_the_trainer_are_rollout_settings():
    from grpo_equivalence.report.sections import differing_settings

    runs = []
    for backend, compile_off, rollout in (("hf", True, []), ("hf_static", False, ["generation.disable_compile"])):
        run = make_stats(backend, 5)
        run["effective_config"] = {"trainer": {"beta": 0.001}, "generation": {"disable_compile": compile_off, "top_k": 5},
                                   "rollout_settings": rollout}
        runs.append(run)
    assert differing_settings(runs) == [{"setting": "generation.disable_compile", "rollout": True,
                                         "values": {"hf": True, "hf_static": False}}]
    runs[1]["effective_config"]["rollout_settings"] = []
    assert differing_settings(runs)[0]["rollout"] is False  # not declared: a difference the reader must see


def test_no_differing_settings_is_said_plainly(stats_dir):
    assert "None: every effective setting read back from the trainers is the same" in from_stats_dir(stats_dir, "vllm")


def test_settings_are_audited_per_step_count(tmp_path):
    """A learning rate that differs at 5 steps is not hidden by agreeing 8-step runs."""
    for steps in (5, 8):
        for backend in ("vllm", "hf"):
            run = make_stats(backend, steps)
            lr = 1e-5 if backend == "hf" and steps == 5 else 5e-6
            run["effective_config"] = {"trainer": {"learning_rate": lr, "use_vllm": backend == "vllm"},
                                       "rollout_settings": ["use_vllm"]}
            stats.write(tmp_path / f"grpo_{backend}_{steps}.json", run)
    text = from_stats_dir(tmp_path, "vllm")
    five = text.split("### Settings that differ between backends (5 steps)")[1].split("## 8 steps")[0]
    eight = text.split("### Settings that differ between backends (8 steps)")[1].split("## Warnings")[0]
    assert "| trainer.learning_rate | 1e-05 | 5e-06 |" in five and "Only rollout settings differ" not in five
    assert "learning_rate" not in eight and "Only rollout settings differ" in eight


def test_sampler_mismatch_is_shown_where_logged_and_not_logged_elsewhere(tmp_path):
    for backend in ("vllm", "hf"):
        run = make_stats(backend, 5)
        if backend == "vllm":
            for i, step in enumerate(run["steps"]):
                step["metrics"].update({"sampling/sampling_logp_difference/mean": 0.01 * (i + 1),
                                        "sampling/importance_sampling_ratio/max": 1.5})
        stats.write(tmp_path / f"grpo_{backend}_5.json", run)
    (table,) = tables_headed(from_stats_dir(tmp_path, "vllm"), "Backend", "logp difference mean")
    rows = {row["Backend"]: row for row in table}
    assert rows["vllm"]["logp difference mean"] == "0.0300" and rows["vllm"]["IS ratio max"] == "1.5000"
    assert rows["hf"]["logp difference mean"] == "not logged" and rows["vllm"]["IS ratio min"] == "not logged"


def test_a_confound_is_a_warning_about_a_sampling_setting_not_a_kernel_name():
    from grpo_equivalence.report.sections import confounds

    def run(*messages):
        return {"warnings": [{"source": "log:x", "message": m, "count": 1} for m in messages]}

    kept = confounds([run("Processor MinPLogitsWarper might not be supported by CB.", "top_k is ignored here",
                          "Triton kernel JIT compilation during inference: _topk_topp_kernel. This causes a latency spike")])
    assert [w["message"] for w in kept] == ["Processor MinPLogitsWarper might not be supported by CB.",
                                            "top_k is ignored here"]


def test_each_comparison_is_its_own_holm_family():
    """A candidate's verdicts are those of its comparison alone: another candidate in the report changes none of
    them. Here hf_static's kl is divergent inside its own family (its 6 metrics) with a p that a
    family of both candidates' metrics would not reject."""
    import math
    import statistics

    from grpo_equivalence.analysis import runs as run_files
    from grpo_equivalence.analysis import verdict
    from grpo_equivalence.analysis.compare import compare
    from grpo_equivalence.report import render, sections

    seeds, offsets = [3407, 3408, 3409, 3410, 3411], [-1.26, -0.63, 0.0, 0.63, 1.26]  # offsets: mean 0, SD 1

    def run(backend, seed, shift):
        level = math.exp(0.3 * seeds.index(seed) + shift)
        return make_stats(backend, 6, seed=seed, kl=lambda i: level)

    shifted = lambda seed: 1.0 + 0.27 * offsets[seeds.index(seed)]  # noqa: E731
    groups = {"hf": [run("hf", s, 0.0) for s in seeds], "hf_static": [run("hf_static", s, shifted(s)) for s in seeds],
              "cb_paged": [run("cb_paged", s, shifted(s)) for s in seeds]}
    files = {f"/x/grpo_{b}_6{'' if s == 3407 else f'_seed{s}'}.json": r
             for b, group in groups.items() for s, r in zip(seeds, group)}
    judged = render.judged(files, "hf")
    tables = sections.step_tables(judged["summaries"], judged["comparisons"], run_files.group_runs(files), "hf")
    in_report = {pair["candidate"]: pair["metrics"] for pair in tables[0]["pairs"]}
    alone = compare(groups["hf"], groups["hf_static"])["metrics"]
    kl = in_report["hf_static"]["kl"]["verdict"]
    index = sequential.look(5)["look"] - 1
    # the window: within the comparison's own family, not within one of both candidates' families together
    family = len(verdict.METRICS)
    assert sequential.nominal(0.05 / (2 * family), index) < kl["p_value"] <= sequential.nominal(0.05 / family, index)
    assert kl["verdict"] == verdict.DIVERGENT and kl["family_size"] == len(verdict.METRICS)
    for metric in verdict.METRICS:
        assert in_report["hf_static"][metric]["verdict"]["verdict"] == alone[metric]["verdict"]["verdict"], metric
    assert statistics.fmean([in_report[c]["kl"]["verdict"]["difference"] for c in in_report]) == pytest.approx(1.0)


def test_the_report_states_each_margin_in_words_and_its_report_wide_false_divergent_chance(stats_dir):
    for steps in (5, 8):
        stats.write(stats_dir / f"grpo_hf_{steps}.json", make_stats("hf", steps, wall=lambda i: 3.0))
    text = from_stats_dir(stats_dir, "vllm", margins={"reward": {"absolute": 0.2}})
    assert "kl within 1.5x; grad_norm within 1.25x" in text and "reward within 0.2;" in text
    assert "loss within 1 SD of a seed-to-seed difference of the reference" in text
    # two candidates at two step counts, each its own family at alpha 0.05: at most 20 %, 18.5 % were they independent
    assert "4 families (2 candidates x 2 step counts), each at alpha 0.05" in text
    assert "at most\n20.0 % (18.5 % were the families" in text


def test_a_report_of_six_candidates_at_two_step_counts_counts_twelve_families(tmp_path):
    """The report-wide chance of a false divergent verdict counts families, candidates x step counts: six candidates
    that train as the reference does, at config.yaml's two step counts, are at most 60 % (12 x 5 %), not 30 %."""
    for steps in (5, 8):
        for backend in ("vllm", "a", "b", "c", "d", "e", "f"):
            stats.write(tmp_path / f"grpo_{backend}_{steps}.json", make_stats(backend, steps, wall=lambda i: 2.0))
    text = from_stats_dir(tmp_path, "vllm")
    assert "12 families (6 candidates x 2 step counts), each at alpha 0.05" in text
    assert "at most\n60.0 % (46.0 % were the families" in text


def test_a_reward_function_that_scored_nothing_is_named_in_the_report_with_the_reason(tmp_path):
    for backend, value in (("vllm", 1.0), ("cb_paged", float("nan"))):
        run = make_stats(backend, 5)
        for step in run["steps"]:
            step["metrics"]["rewards/my_reward/mean"] = value
        stats.write(tmp_path / f"grpo_{backend}_5.json", run)
    text = from_stats_dir(tmp_path, "vllm")
    assert ("Reward function `my_reward` is not judged for cb_paged: scored no completion at every step of cb_paged "
            "x 5 (seed 3407) (it returned None or NaN for every completion there).") in text


def test_a_backend_with_an_injected_fault_is_marked_wherever_a_table_names_it(tmp_path):
    for backend in ("hf", "hf+temperature_up"):
        stats.write(tmp_path / f"grpo_{backend}_5.json", make_stats(backend, 5))
    text = from_stats_dir(tmp_path, "hf")
    assert "**Injected faults.** `hf+temperature_up` runs with the sampler's temperature x1.1" in text
    rows = [line for line in text.splitlines() if line.startswith("|") and "hf+temperature_up" in line]
    assert len(rows) >= 3 and all("hf+temperature_up (injected fault)" in row for row in rows), rows


def test_a_configuration_is_said_once_and_never_marked_as_a_fault(tmp_path):
    for backend in ("native", "native+liger"):
        stats.write(tmp_path / f"grpo_{backend}_5.json", make_stats(backend, 5))
    text = from_stats_dir(tmp_path, "native")
    assert "**Configurations.** `native+liger` is `native` with TRL's Liger kernels" in text
    assert "Injected faults" not in text and "(injected fault)" not in text


def test_a_candidate_whose_runs_spread_far_more_than_the_references_is_named_with_the_ratio(tmp_path):
    """The stated error rates assume runs distributed alike up to a shift: a candidate whose runs' loss spreads ten
    times the reference's is named beside the verdicts, with the ratio, and the null is said in the introduction."""
    for i, offset in enumerate((0.0, 0.1, -0.1)):
        seed = 3407 + i
        suffix = "" if i == 0 else f"_seed{seed}"
        stats.write(tmp_path / f"grpo_vllm_6{suffix}.json", make_stats("vllm", 6, seed=seed,
                                                                       loss=lambda s, o=offset: 0.1 * s + o))
        stats.write(tmp_path / f"grpo_hf_6{suffix}.json", make_stats("hf", 6, seed=seed,
                                                                     loss=lambda s, o=offset: 0.1 * s + 10 * o))
    text = from_stats_dir(tmp_path, "vllm")
    assert "**Spread**" in text and "hf loss (10.0x)" in text
    assert "distributed as the reference's, up to a shift of the mean" in text
