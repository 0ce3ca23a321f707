"""Real GRPO training with TRL on the primed tiny model, one short run per CPU backend."""

import pytest

from grpo_equivalence.analysis import stats, summary
from grpo_equivalence.training import backends, session, train
from grpo_equivalence.training.backends import Backend, BackendUnavailable
from grpo_equivalence.training.rewards import REWARD_NAMES

CPU_BACKENDS = ("hf", "cb_paged", "hf_static", "native")


@pytest.fixture(scope="module")
def runs(primed, tiny_study, tmp_path_factory):
    out = tmp_path_factory.mktemp("stats")
    results = {}
    for backend in CPU_BACKENDS:
        path = out / f"grpo_{backend}_4.json"
        train.run(tiny_study, backend, 4, model_path=primed["model"], dataset=primed["dataset"], out=path, log=lambda s: None)
        results[backend] = stats.load(path)
    return results


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_statistics_file_has_every_step_and_metric(runs, backend):
    run = runs[backend]
    assert run["backend"] == backend and run["max_steps"] == 4
    assert [s["step"] for s in run["steps"]] == [1, 2, 3, 4]
    for step in run["steps"]:
        # beta != 0 for every backend, so kl is logged (a trap of the original study)
        for key in ("loss", "grad_norm", "reward", "kl", "wall_s", "peak_mem_gb"):
            assert isinstance(step[key], float), (key, step[key])
        for name in REWARD_NAMES:
            assert f"rewards/{name}/mean" in step["metrics"]
        for key in ("reward_std", "frac_reward_zero_std", "entropy", "completions/mean_length"):
            assert key in step["metrics"]
    assert run["train_wall_s"] >= sum(s["wall_s"] for s in run["steps"]) * 0.9
    assert run["peak_mem_gb"] == max(s["peak_mem_gb"] for s in run["steps"]) > 0
    # the workflow's own kl, beside the stack's: TRL's is the same token mean (the same model, float32)
    for step in run["steps"]:
        assert step["kl"] == pytest.approx(step["kl_logged"], rel=1e-4, abs=1e-7)
        assert step["metrics"]["kl_compute_s"] > 0
    assert run["environment"]["memory_bandwidth_gbs"] is None  # measured on CUDA only
    # each backend's generation is timed, so the summary splits a step into rollout and training
    assert summary.summarise(run, 1)["median_rollout_s"] > 0


def test_adapter_precision_is_recorded(runs):
    for run in runs.values():
        assert run["effective_config"]["trainable_dtypes"] == ["float32"]  # the tiny study trains in float32


def test_weights_bytes_are_recorded(runs, primed):
    """What a decode step reads at least once: the base model's float32 weights and the LoRA adapters."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(primed["model"]).num_parameters()
    for run in runs.values():
        assert run["model_bytes"] == 4 * (base + run["effective_config"]["trainable_parameters"])


def test_hf_static_generates_with_a_static_cache_and_compilation_on(runs, tiny_study):
    generation = runs["hf_static"]["effective_config"]["generation"]
    assert generation["cache_implementation"] == "static"
    assert generation["max_cache_len"] == tiny_study["max_seq_length"]  # one size for every step: no recompile
    assert generation.get("disable_compile", False) is False  # TRL sets True; the backend turns it back on
    assert runs["hf"]["effective_config"]["generation"]["disable_compile"] is True
    assert runs["hf_static"]["effective_config"]["rollout_settings"] == [
        "cache_implementation", "generation.disable_compile", "generation.max_cache_len"]


def test_alternate_recorder_does_the_full_work_on_odd_steps_only(primed, tiny_study, tmp_path):
    """One run holds steps with and without the full recorder: their ratio is its cost, free of run-to-run noise."""
    config = {**tiny_study, "recorder": "alternate"}
    train.run(config, "hf", 4, model_path=primed["model"], dataset=primed["dataset"], out=tmp_path / "s.json",
              log=lambda s: None)
    steps = stats.load(tmp_path / "s.json")["steps"]
    assert [s["peak_mem_gb"] is not None for s in steps] == [True, False, True, False]
    assert all(s["wall_s"] > 0 and s["profile"]["GRPOTrainer.transformers.generate"] > 0 for s in steps)


COMPILE_PROBE = """
import json, torch
from grpo_equivalence.training import train
assert train.compile_counts() is None  # nothing compiled yet
f = torch.compile(lambda x: (x.sin() * 2).sum())
f(torch.randn(8, requires_grad=True)).backward()
print(json.dumps(train.compile_counts()))
"""


@pytest.mark.slow
def test_a_run_records_what_torch_compile_compiled_and_what_the_shared_cache_served(tmp_path):
    """The second process of a compile-cache folder finds its graphs there (the record a slow first step is read
    against: misses or bypasses with a warm folder say the cache did not serve it)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "t")}
    first, second = (json.loads(subprocess.run([sys.executable, "-c", COMPILE_PROBE], env=env, capture_output=True,
                                               text=True, check=True, timeout=300).stdout) for _ in range(2))
    assert first["graphs"] == second["graphs"] == 1
    assert first["fx_graph_cache"]["miss"] >= 1 and first["fx_graph_cache"]["hit"] == 0
    assert second["fx_graph_cache"]["hit"] == first["fx_graph_cache"]["miss"] and second["fx_graph_cache"]["miss"] == 0
    assert second["autograd_cache"]["hit"] == 1


def test_timestamps_recorder_records_step_times_only(primed, tiny_study, tmp_path):
    """The recorder's own cost is measured against this one (benchmarks/callback_overhead.py)."""
    config = {**tiny_study, "recorder": "timestamps"}
    train.run(config, "hf", 3, model_path=primed["model"], dataset=primed["dataset"], out=tmp_path / "s.json",
              log=lambda s: None)
    run = stats.load(tmp_path / "s.json")
    assert [s["step"] for s in run["steps"]] == [1, 2, 3]
    assert all(s["wall_s"] > 0 and s["peak_mem_gb"] is None and "profile" not in s for s in run["steps"])
    assert all(s["loss"] is not None and s["reward"] is not None for s in run["steps"])  # the trainer's logs still
    assert sum(s["wall_s"] for s in run["steps"]) <= run["train_wall_s"]


def test_rewards_vary_within_groups_on_most_steps(runs):
    # over the three runs' steps: a 4-step run of 2 groups a step can fall either side of one half by chance
    fractions = [s["metrics"]["frac_reward_zero_std"] for run in runs.values() for s in run["steps"]]
    assert sum(f < 1 for f in fractions) > len(fractions) / 2, fractions


def test_settings_are_read_back_and_identical_across_backends(runs, tiny_study):
    hf, cb = (runs[b]["effective_config"] for b in ("hf", "cb_paged"))
    for key, value in tiny_study["grpo"].items():
        assert hf["trainer"][key] == value, key
    assert hf["trainer"]["use_transformers_continuous_batching"] is False
    assert cb["trainer"]["use_transformers_continuous_batching"] is True
    differing = {k for k in hf["trainer"] if hf["trainer"][k] != cb["trainer"][k]}
    assert differing == {"use_transformers_continuous_batching", "transformers_continuous_batching_config"}
    assert hf["lora"] == cb["lora"] and hf["lora"]["r"] == tiny_study["lora"]["r"]


def test_environment_is_recorded(runs):
    env = runs["hf"]["environment"]
    assert env["packages"]["trl"] and env["packages"]["transformers"] and env["gpu_count"] == 0


def test_unavailable_backend_stops_before_loading_a_model(tiny_config, monkeypatch, tmp_path):
    missing = Backend(name="needs_xyz", summary="test", packages=(("no_such_module_xyz", "xyz-package"),))
    monkeypatch.setattr(backends, "get", lambda name: missing)
    with pytest.raises(BackendUnavailable) as error:
        train.run(tiny_config, "needs_xyz", 4, model_path=str(tmp_path / "no-model-here"), dataset={}, out=tmp_path / "s.json")
    message = str(error.value)
    assert "backend 'needs_xyz' cannot run here" in message
    assert "pip install xyz-package" in message and "drop 'needs_xyz' from `backends`" in message
    assert not (tmp_path / "s.json").exists()


def test_cuda_backend_on_a_cpu_job_names_the_fix():
    gpu_only = Backend(name="gpu_only", summary="test", needs_cuda=True)
    with pytest.raises(BackendUnavailable, match="needs a CUDA GPU and this job has none"):
        gpu_only.check_runnable("cpu")


def test_gpu_job_without_a_gpu_fails_clearly(tiny_config, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    tiny_config["gpus_per_train_job"] = 1
    with pytest.raises(RuntimeError, match="asked for 1 GPU.*no CUDA device is visible"):
        train.run(tiny_config, "hf", 4, model_path=str(tmp_path), dataset={}, out=tmp_path / "s.json")


@pytest.mark.parametrize("backend, block", [("hf", "GRPOTrainer.transformers.generate"),
                                            ("cb_paged", "GRPOTrainer.transformers.generate_batch")])
def test_where_each_steps_time_goes_is_recorded(runs, backend, block):
    """TRL times its blocks for W&B only; the run keeps them per step, and the summary splits the step."""
    from grpo_equivalence.analysis.summary import summarise

    run = runs[backend]
    for step in run["steps"]:
        assert 0 < step["profile"][block] < step["wall_s"]
    summary = summarise(run, skip=1)
    timed = [s for s in run["steps"] if s["step"] > 1]
    assert summary["median_rollout_s"] > 0 and summary["median_weight_sync_s"] == 0
    import statistics

    assert summary["median_training_s"] == pytest.approx(statistics.median(s["wall_s"] - s["profile"][block] for s in timed))
    assert summary["median_rollout_s"] == pytest.approx(statistics.median(s["profile"][block] for s in timed))
    tokens = [s["metrics"]["completions/mean_length"] * 8 / s["profile"][block] for s in timed]  # batch of 8
    assert summary["rollout_tokens_per_s"] == pytest.approx(statistics.median(tokens))
    assert summary["decode_ms_per_step"] > 0


def test_a_trl_field_outside_the_schema_reaches_the_trainer_and_a_tracker_writes_offline(primed, tiny_config, tmp_path,
                                                                                         monkeypatch):
    """Any field of GRPOConfig passes (checked against its dataclass); report_to is the study's; every run logs
    its progress."""
    monkeypatch.chdir(tmp_path)  # results/tracking/ lands here
    tiny_config["grpo"].update(adam_beta2=0.99, report_to=["tensorboard"])
    lines = []
    train.run(tiny_config, "hf", 3, model_path=primed["model"], dataset=primed["dataset"], out=tmp_path / "grpo_hf_3.json",
              study="mystudy", log=lines.append)
    run = stats.load(tmp_path / "grpo_hf_3.json")
    assert run["effective_config"]["trainer"]["adam_beta2"] == 0.99
    assert run["effective_config"]["trainer"]["report_to"] == ["tensorboard"]
    assert run["effective_config"]["trainer"]["project"] == "mystudy"
    events = list((tmp_path / "results/tracking/tensorboard/mystudy/hf_3_seed3407").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    progress = [line for line in lines if " step " in line and " of 3, " in line]
    assert [line.split(" step ")[1].split(" of")[0] for line in progress] == ["1", "2", "3"]
    assert progress[-1].startswith("[hf x 3] step 3 of 3, ") and progress[-1].endswith("about 0 s left")


def test_a_misspelt_or_owned_grpo_field_stops_the_job_before_any_model_is_loaded(tiny_config):
    tiny_config["grpo"].update(adam_betta2=0.99)
    with pytest.raises(SystemExit, match="grpo.adam_betta2: not a field of trl .*'s GRPOConfig; fix its spelling "
                                         r"\(close: adam_beta2"):
        session.check_packages("hf", tiny_config)
    tiny_config["grpo"] = {**tiny_config["grpo"], "max_steps": 5}
    tiny_config["grpo"].pop("adam_betta2")
    with pytest.raises(SystemExit, match="grpo.max_steps: set by the workflow, not the study"):
        session.check_packages("hf", tiny_config)


def test_a_backend_imports_what_must_come_first_before_transformers_is(primed, tiny_study, tmp_path):
    """Unsloth must be imported before transformers (it patches it at import); train.run imports transformers for its
    callbacks, so it runs the backend's before_trl_import first. A stand-in hook records what was imported by then,
    in a fresh process, which stops there."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    code = """
import json, sys
from pathlib import Path
from grpo_equivalence.training import backends, session, train
hf = backends.get("hf")
seen = []
def hook(self):
    seen.append("transformers" in sys.modules)
    raise SystemExit(0)  # what follows is every run's
type(hf).before_trl_import = hook
try:
    train.run(json.loads(sys.argv[1]), "hf", 4, model_path=sys.argv[2], dataset=json.loads(sys.argv[3]),
              out=Path(sys.argv[4]), log=lambda s: None)
finally:
    print("SEEN", json.dumps(seen))
"""
    done = subprocess.run([sys.executable, "-c", code, json.dumps(tiny_study), primed["model"],
                           json.dumps(primed["dataset"]), str(tmp_path / "run.json")], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.split("SEEN", 1)[1])
    assert seen and seen[0] is False  # the first call came before transformers was imported


def test_a_stack_logging_another_kl_is_judged_on_the_one_computed_for_every_stack(primed, tiny_study, tmp_path,
                                                                                monkeypatch):
    """A trainer stack whose logged kl is another quantity (here TRL's, scaled three times, as Unsloth's per-sequence
    means differ from TRL's token mean) records it as kl_logged; the kl the verdict judges is the workflow's own,
    the same as the unscaled run's; and runs that differ in their logged kl alone are not divergent on kl."""
    import copy

    from transformers import Trainer

    from grpo_equivalence.analysis import verdict

    plain = train.run(tiny_study, "hf", 3, model_path=primed["model"], dataset=primed["dataset"],
                      out=tmp_path / "plain.json", log=lambda s: None)
    log = Trainer.log  # GRPOTrainer.log adds its metrics, then hands them to Trainer.log

    def scaled(self, logs, *args, **kwargs):
        return log(self, {**logs, "kl": 3 * logs["kl"]} if "kl" in logs else logs, *args, **kwargs)

    monkeypatch.setattr(Trainer, "log", scaled)
    other = train.run(tiny_study, "hf", 3, model_path=primed["model"], dataset=primed["dataset"],
                      out=tmp_path / "other.json", log=lambda s: None)
    for a, b in zip(plain["steps"][1:], other["steps"][1:], strict=True):
        assert b["kl_logged"] == pytest.approx(3 * a["kl_logged"], rel=1e-5) and b["kl"] == pytest.approx(a["kl"])

    def seeds(run, factor):  # a run's statistics at three seeds, their kl spread as reseeding spreads it
        runs = []
        for i, shift in enumerate((0.9, 1.0, 1.1)):
            copy_ = copy.deepcopy(run)
            copy_["seed"] = 3407 + i
            for step in copy_["steps"]:
                step["kl"] = step["kl"] * shift
                step["kl_logged"] = step["kl"] * factor
            runs.append(copy_)
        return runs

    judged = verdict.judge_runs(seeds(plain, 1.0), seeds(other, 3.0), "kl")
    assert judged["verdict"] != verdict.DIVERGENT, judged


def test_a_study_with_several_iterations_a_generation_runs_to_its_report(primed, tiny_study, tmp_path):
    """grpo.num_iterations: 2 trains each generation twice: TRL logs the rollout's metrics (reward, completion
    length, each reward function) at the steps that sampled only. They are absent at the others, not an error: the
    summaries, step differences and the report use the steps that logged them."""
    import copy

    from grpo_equivalence.analysis import runs as run_files
    from grpo_equivalence.report.render import from_stats_dir

    for backend in ("hf", "hf_static"):
        for i in range(2):
            config = copy.deepcopy(tiny_study)
            config["grpo"].update(num_iterations=2, seed=3407 + i)
            name = f"grpo_{backend}_4.json" if i == 0 else f"grpo_{backend}_4_seed{3407 + i}.json"
            run = train.run(config, backend, 4, model_path=primed["model"], dataset=primed["dataset"],
                            out=tmp_path / name, log=lambda s: None)
    assert [s["reward"] is None for s in run["steps"]] == [False, True, False, True]
    assert run_files.logged_steps(run, "reward") == [1, 3] and all(s["kl"] is not None for s in run["steps"])
    text = from_stats_dir(tmp_path, "hf")
    assert "## 4 steps" in text and "Verdicts against hf" in text
