"""The catalogue of bad inputs and the message each one gets: one line that names the problem and the fix,
before any job runs where the input is the study's, and never a traceback or a silently wrong report.

Each table below is the catalogue for one kind of input; every row is a test.
"""

import json
import math
import re
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, tiny_yaml
from grpo_equivalence import cli
from grpo_equivalence.analysis import stats
from grpo_equivalence.report import render
from grpo_equivalence.study.config import ConfigError, load_study
from grpo_equivalence.study.validate import check
from helpers import make_stats, tables_headed

# --- The study file ----------------------------------------------------------------------------------------

def write_data(path, text):
    path.write_text(text)
    return str(path)


STUDIES = [
    # (what is wrong, change to the tiny study (given tmp_path), words of the message)
    ("a backend with an empty fault (a backend of its own before)", lambda c, d: c.update(backends=["hf", "hf+"]),
     "backends: 'hf+' has a '+' and no fault after it; write 'hf', or hf+FAULT"),
    ("a faulted reference without saying so", lambda c, d: c.update(backends=["hf+temperature_up", "cb_paged"],
                                                                    reference="hf+temperature_up"),
     "reference: 'hf+temperature_up' has an injected fault: every verdict would be against a sampler known to be wrong"),
    ("two runs a backend, which reach no planned look", lambda c, d: c.update(replicates={"reference": 3, "others": 2}),
     "replicates.others: 2 runs reach no planned look of the training verdict"),
    ("thousands of runs (planning them took minutes)", lambda c, d: c.update(replicates={"reference": 1000, "others": 3}),
     "replicates.reference: 1000 is greater than the maximum of 100"),
    ("a number YAML reads as text", lambda c, d: c["grpo"].update(learning_rate="5e-4"),
     "grpo.learning_rate: '5e-4' is text to YAML, not a number; write it with a dot and a signed exponent, e.g. 5.0e-4"),
    ("a model folder that does not exist", lambda c, d: c.update(model=str(d / "no-such-model")),
     "is not a folder; give a model folder (with config.json) or a hub id"),
    ("a model folder without config.json", lambda c, d: (d / "empty-model").mkdir() or c.update(model=str(d / "empty-model")),
     "has no config.json; give the folder that save_pretrained wrote"),
    ("a data file that does not exist", lambda c, d: c.update(dataset={"path": "json", "data_files": str(d / "none.jsonl")}),
     "none.jsonl does not exist; fix the path"),
    ("an empty data file", lambda c, d: c.update(dataset={"path": "json", "data_files": write_data(d / "e.jsonl", "\n")}),
     "e.jsonl is empty; it needs one problem per line"),
    ("a data file without the study's columns",
     lambda c, d: c.update(dataset={"path": "json", "data_files": write_data(d / "q.jsonl", '{"question": "1+1", "solution": "2"}\n')}),
     "q.jsonl has no column 'prompt' (columns: question, solution); set dataset.prompt_column"),
    ("a csv data file without the answer column the study's rewards take",
     lambda c, d: c.update(dataset={"path": "csv", "data_files": write_data(d / "q.csv", "prompt,result\n1+1,2\n2+2,4\n")}),
     "reward 'check_answer' takes 'answer', a column the data set does not have (its columns: prompt, result)"),
    ("a csv data file with only its header",
     lambda c, d: c.update(dataset={"path": "csv", "data_files": write_data(d / "h.csv", "prompt,solution\n\n")}),
     "h.csv has a header but no rows; it needs one problem per row"),
    ("a GRPOConfig field misspelt", lambda c, d: c["grpo"].update(adam_betta2=0.99),
     "grpo.adam_betta2: not a field of trl"),
    ("a GRPOConfig field of the wrong type", lambda c, d: c["grpo"].update(torch_compile="yes"),
     "grpo.torch_compile: 'yes' is not of GRPOConfig's type for it"),
    ("a GRPOConfig field the workflow owns", lambda c, d: c["grpo"].update(logging_steps=10),
     "grpo.logging_steps: set by the workflow, not the study: the statistics need one log per optimizer step"),
    ("a file builder without data_files", lambda c, d: c.update(dataset={"path": "json"}),
     'dataset.data_files: the "json" builder reads local files; name them in dataset.data_files'),
    ("a data set of one problem (a run trained 0 steps, and was cached)",
     lambda c, d: (d / "one.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n') and c.update(
         dataset={"path": "json", "data_files": str(d / "one.jsonl")}),
     "dataset: 1 problem(s), fewer than one step's 2 prompts"),
    ("bytes that are not UTF-8 in a JSON lines file",
     lambda c, d: (d / "latin.jsonl").write_bytes(b'{"prompt": "1+1", "answer": "2"}\n{"prompt": "caf\xe9", '
                                                   b'"answer": "1"}\n') and c.update(
         dataset={"path": "json", "data_files": str(d / "latin.jsonl")}),
     "latin.jsonl is not UTF-8 at line 2 (byte 48: b'\\xe9'); save it as UTF-8 text"),
    ("completions as long as the sequence", lambda c, d: c["grpo"].update(max_completion_length=4096),
     "grpo.max_completion_length: 4096 tokens leave no room for a prompt within max_seq_length 256"),
]


@pytest.mark.parametrize("what, change, message", STUDIES, ids=[s[0] for s in STUDIES])
def test_bad_study(tiny_config, tmp_path, what, change, message):
    change(tiny_config, tmp_path)
    with pytest.raises(ConfigError) as error:
        check(tiny_config)
    assert message in str(error.value)


@pytest.mark.parametrize("name, text", [("sheet.csv", "prompt,solution\n1+1,2\n2+2,4\n"),
                                        ("lines.jsonl", '{"prompt": "1+1", "solution": "2"}\n{"prompt": "2+2", "solution": "4"}\n')])
def test_a_data_file_with_a_byte_order_mark_is_read_as_load_dataset_reads_it(tiny_config, tmp_path, name, text):
    """A UTF-8 byte-order mark, as spreadsheet programs save CSV, is not part of the first column's name."""
    from grpo_equivalence.training.data import load_problems

    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    dataset = {"path": "csv" if name.endswith(".csv") else "json", "data_files": str(path)}
    tiny_config.update(dataset=dataset)
    check(tiny_config)
    assert load_problems(dataset, system_prompt=None)[0]["answer"] == "2"
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("solution", "result").encode())  # still names what is missing
    with pytest.raises(ConfigError, match="reward 'check_answer' takes 'answer', a column the data set does not have "
                                          "\\(its columns: prompt, result\\)"):
        check(tiny_config)


def test_a_faulted_reference_is_allowed_when_the_study_says_so(tiny_config):
    tiny_config.update(backends=["hf+temperature_up", "cb_paged"], reference="hf+temperature_up", faulted_reference=True)
    check(tiny_config)


def test_every_problem_of_a_study_is_reported_at_once(tiny_config):
    tiny_config.update(foo=1, reference="vllm", steps=[2])
    tiny_config["grpo"]["learning_rate"] = "5e-4"
    with pytest.raises(ConfigError) as error:
        check(tiny_config)
    lines = str(error.value).splitlines()[1:]
    assert [line.split(":")[0].strip(" -") for line in lines] == ["foo", "grpo.learning_rate", "reference", "steps"]


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("model: tiny\nsteps: [4, 6\nreference: hf\n")
    with pytest.raises(ConfigError) as error:
        load_study(path)
    assert str(error.value).startswith(f"{path}:3:10: not valid YAML")


def run_snakemake(workdir, study_path, *args):
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
                           "--cores", "1", "--config", f"study={study_path}", *args],
                          capture_output=True, text=True)


def test_yaml_error_through_snakemake_names_the_line_before_any_job(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text((ROOT / "studies" / "tiny.yaml").read_text().replace("steps: [6, 12]", "steps: [6, 12"))
    result = run_snakemake(tmp_path, path)
    assert result.returncode != 0
    assert f"{path}:" in result.stderr and "not valid YAML" in result.stderr
    assert not (tmp_path / "results").exists()


def test_missing_data_file_stops_snakemake_before_any_job(tmp_path):
    config = tiny_yaml()
    config["dataset"] = {"path": "json", "data_files": str(tmp_path / "missing.jsonl")}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_snakemake(tmp_path, path)
    assert result.returncode != 0 and "missing.jsonl does not exist; fix the path" in result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_section_on_the_command_line_merges_into_the_studys(tmp_path):
    """`--config 'grpo={learning_rate: 1.0e-5}'` changes that key and keeps the section's others."""
    result = run_snakemake(tmp_path, ROOT / "studies" / "tiny.yaml", "grpo={learning_rate: 1.0e-5, adam_beta2: 0.99}",
                           "--dry-run", "--printshellcmds")
    assert result.returncode == 0, result.stderr[-2000:]
    # each job's settings are in the file its command names (@FILE: a command a line long)
    settings = "".join((tmp_path / name).read_text() for name in re.findall(r"@(\S+\.json)", result.stdout))
    assert '"learning_rate": 1e-05' in settings and '"adam_beta2": 0.99' in settings
    assert '"num_generations": 4' in settings  # the rest of the section is still there


def test_config_values_on_the_command_line_are_typed(tmp_path):
    """`--config steps=[4,7]` reaches the study as numbers, not as the text Snakemake passes."""
    result = run_snakemake(tmp_path, ROOT / "studies" / "tiny.yaml", "steps=[4,7]", "--dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "results/tiny/stats/grpo_hf_7.json" in result.stdout  # the tiny study's folder: results/NAME


# --- A statistics file ---------------------------------------------------------------------------------------

def with_step(field, value, step=2):
    def change(data):
        data["steps"][step - 1][field] = value
    return change


STATS_FILES = [
    # (what is wrong, change to a valid file's data (or a writer of the path), words of the message)
    ("a metric given as text", with_step("loss", "0.5"), "step 2: loss is str \"0.5\", not a number"),
    # The judged metrics under `metrics` (the report reads them as numbers)
    *[(f"{name} given as text", lambda d, name=name: d["steps"][1]["metrics"].update({name: "abc"}),
       f"step 2: metrics.{name} is str \"abc\", not a number")
      for name in ("entropy", "completions/mean_length", "frac_reward_zero_std")],
    ("trainer settings given as a list", lambda d: d["effective_config"].update(trainer=[1, 2]),
     "effective_config.trainer is list [1, 2], not an object (or null)"),
    ("no wall time", with_step("wall_s", None), "step 2: wall_s is null, not a positive number of seconds"),
    ("zero wall time", with_step("wall_s", 0.0), "step 2: wall_s is float 0.0, not a positive number of seconds"),
    ("a step that is not an object", lambda d: d["steps"].__setitem__(1, 5), "steps[1] is int 5, not an object"),
    ("metrics that are not an object", with_step("metrics", [1]), "step 2: metrics is list [1], not an object"),
    ("a run wall time of zero", lambda d: d.update(train_wall_s=0), "train_wall_s is int 0, not a positive number"),
    ("a backend that is not a name", lambda d: d.update(backend=None), "backend is null, not a backend name"),
    ("a step count as text", lambda d: d.update(max_steps="6"), "max_steps is str \"6\", not a positive integer"),
    ("an empty object", lambda d: d.clear(), "missing run key(s)"),
    ("a missing step", lambda d: d["steps"].pop(2), "missing [3]"),
    ("a duplicated step", lambda d: d["steps"].insert(1, dict(d["steps"][0])), "step(s) [1] appear more than once"),
    ("a missing metric key", lambda d: d["steps"][0].pop("kl"), "step 1 lacks kl (use null for a metric not logged)"),
    ("another schema", lambda d: d.update(schema_version=2), "schema_version 2, expected 1"),
]


@pytest.mark.parametrize("what, change, message", STATS_FILES, ids=[s[0] for s in STATS_FILES])
def test_bad_statistics_file(tmp_path, what, change, message):
    data = make_stats("hf", 6)
    change(data)
    path = tmp_path / "grpo_hf_6.json"
    path.write_text(json.dumps(data))
    with pytest.raises(stats.StatsError) as error:
        stats.load(path)
    assert str(error.value).startswith(f"{path}:") and message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("what, write, message", [
    ("binary content", lambda p: p.write_bytes(bytes(range(256))), "not a text file (binary content)"),
    ("a folder", lambda p: p.mkdir(), "is a folder, not a statistics file"),
    ("a truncated file", lambda p: p.write_text('{"schema_version": 1, "steps": ['), "not valid JSON"),
    ("a JSON list", lambda p: p.write_text("[1, 2]"), "holds a JSON list, not an object"),
    ("JSON null", lambda p: p.write_text("null"), "holds a JSON NoneType, not an object"),
])
def test_unreadable_statistics_file(tmp_path, what, write, message):
    path = tmp_path / "grpo_hf_6.json"
    write(path)
    with pytest.raises(stats.StatsError) as error:
        stats.load(path)
    assert message in str(error.value) and str(path) in str(error.value)


def test_cli_reports_a_bad_file_in_one_line(tmp_path):
    path = tmp_path / "grpo_hf_6.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(SystemExit) as error:
        cli.summarise_main([str(path)])
    assert str(error.value).startswith("error: ") and str(path) in str(error.value) and "\n" not in str(error.value)


# --- The files of one report -----------------------------------------------------------------------------------

def stats_dir(tmp_path, files: dict) -> str:
    for name, data in files.items():
        stats.write(tmp_path / name, data)
    return str(tmp_path)


def short_run():
    data = make_stats("hf", 6)
    data["steps"] = data["steps"][:4]
    return data


REPORT_INPUTS = [
    ("two files for one backend and step count",
     {"grpo_vllm_6.json": make_stats("vllm", 6), "grpo_hf_6.json": make_stats("hf", 6),
      "grpo_hf_6_seed3407.json": make_stats("hf", 6, reward=lambda i: 9.0)},
     "grpo_hf_6.json and {dir}/grpo_hf_6_seed3407.json are both hf x 6 steps with seed 3407: keep one of them"),
    ("a name that disagrees with the backend inside",
     {"grpo_vllm_6.json": make_stats("vllm", 6), "grpo_hf_6.json": make_stats("cb_paged", 6)},
     "grpo_hf_6.json: its name says backend hf, the file holds backend cb_paged; rename the file or fix its backend"),
    ("a name that disagrees with the step count inside",
     {"grpo_vllm_6.json": make_stats("vllm", 6), "grpo_hf_8.json": make_stats("hf", 6)},
     "grpo_hf_8.json: its name says max_steps 8, the file holds max_steps 6"),
    ("a run that stopped before its max_steps",
     {"grpo_vllm_6.json": make_stats("vllm", 6), "grpo_hf_6.json": short_run()},
     "grpo_hf_6.json: 4 of max_steps=6 steps recorded: the run stopped early; rerun it, or remove the file"),
    ("a stray file named like a statistics file",
     {"grpo_vllm_6.json": make_stats("vllm", 6), "grpo_hf.json": make_stats("hf", 6)},
     "grpo_hf.json: not named grpo_<backend>_<steps>[_seed<seed>].json"),
]


@pytest.mark.parametrize("what, files, message", REPORT_INPUTS, ids=[r[0] for r in REPORT_INPUTS])
def test_bad_report_inputs(tmp_path, what, files, message):
    folder = stats_dir(tmp_path, files)
    with pytest.raises(SystemExit) as error:
        cli.report_main(["--stats-dir", folder, "--reference", "vllm"])
    assert message.format(dir=folder) in str(error.value)
    assert len(str(error.value).splitlines()) == 1


def minimal(backend, n=5):
    """Only the contract's required fields, as another tool might write them."""
    data = make_stats(backend, n)
    for step in data["steps"]:
        del step["metrics"]
    data.update(effective_config={}, environment={})
    return data


def test_a_file_with_only_the_contracts_fields_renders_with_not_recorded(tmp_path):
    folder = stats_dir(tmp_path, {"grpo_vllm_5.json": minimal("vllm"), "grpo_hf_5.json": minimal("hf")})
    text = render.from_stats_dir(folder, "vllm")
    assert "Environment of the vllm run: not recorded;" in text and "package versions not recorded" in text
    assert "| trainer settings | not recorded |" in text and "Project commit not recorded." in text


def test_no_json_output_holds_nan_and_a_diverged_run_is_refused(tmp_path, capsys):
    diverged = make_stats("hf", 6, loss=lambda i: float("nan") if i == 5 else 0.1)
    stats.write(tmp_path / "grpo_hf_6.json", diverged)
    raw = (tmp_path / "grpo_hf_6.json").read_text()
    json.loads(raw, parse_constant=lambda c: pytest.fail(f"{c} written into JSON"))  # strict JSON
    assert math.isnan(stats.load(tmp_path / "grpo_hf_6.json")["steps"][4]["loss"])  # a diverged run stays diverged
    cli.summarise_main([str(tmp_path / "grpo_hf_6.json")])
    json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in a summary"))
    stats.write(tmp_path / "grpo_vllm_6.json", make_stats("vllm", 6))
    with pytest.raises(SystemExit, match="loss is nan at step 5; the run diverged"):
        cli.report_main(["--stats-dir", str(tmp_path), "--reference", "vllm"])


def test_a_pipe_in_a_value_does_not_break_the_tables(tmp_path):
    runs = {}
    for backend, value in (("vllm", "a|b"), ("hf", "c")):
        data = make_stats(backend, 5)
        data["effective_config"] = {"trainer": {"optim": value}}
        runs[f"grpo_{backend}_5.json"] = data
    text = render.from_stats_dir(stats_dir(tmp_path, runs), "vllm")
    (differing,) = tables_headed(text, "Setting", "hf")
    assert differing == [{"Setting": "trainer.optim", "hf": "c", "vllm": "a|b"}]
    assert "| trainer.optim | c | a\\|b |" in text


@pytest.mark.parametrize("grpo", [{"repetition_penalty": 1.1}, {"generation_kwargs": {"min_length": 5}},
                                  {"generation_kwargs": {"exponential_decay_length_penalty": [2, 3.0]}},
                                  {"generation_kwargs": {"sequence_bias": {"1": 2.0}, "forced_eos_token_id": 3}}])
def test_a_sampling_setting_native_does_not_implement_is_refused_by_name_before_any_job(tiny_config, grpo):
    """An allow-list: what the decoder implements and what does not change what is sampled; the rest by name."""
    tiny_config["grpo"].update(grpo)
    check(tiny_config)  # hf implements them all
    tiny_config.update(backends=["hf", "native"])
    with pytest.raises(ConfigError, match="grpo: backend 'native' samples with temperature, top_k, top_p and min_p "
                                          "only; this study also sets") as error:
        check(tiny_config)
    for name in {**grpo.get("generation_kwargs", {}), **{k: v for k, v in grpo.items() if k != "generation_kwargs"}}:
        assert f"{name}=" in str(error.value)
    tiny_config["grpo"].update(repetition_penalty=1.0, generation_kwargs={"top_k": 5, "use_cache": True})
    check(tiny_config)  # implemented, neutral, or off


def test_a_key_set_twice_in_a_study_file_is_refused_with_its_line(tmp_path):
    """YAML keeps the last of two equal keys without a word: the study file is refused, naming the line."""
    from grpo_equivalence.study.config import load_study

    path = tmp_path / "study.yaml"
    path.write_text("name: twice\ngrpo:\n  learning_rate: 5.0e-4\n  learning_rate: 1.0e-3\n")
    with pytest.raises(ConfigError, match="study.yaml:4: 'learning_rate' is set twice in one mapping"):
        load_study(path)


@pytest.mark.parametrize("returns, message", [
    (lambda n: ["good"] * n, "returned 'good', not a number (or None) per completion"),
    (lambda n: 1.0, "returned float, not a number (or None) per completion"),
    (lambda n: [1.0] * (n + 1), "returned 3 values for 2 completions"),
    (lambda n: 1 / 0, "raised ZeroDivisionError: division by zero; fix that function"),
])
def test_a_reward_that_fails_or_returns_what_trl_cannot_use_is_named_in_the_error(returns, message):
    from grpo_equivalence.training import rewards

    def mine(completions, **kwargs):
        return returns(len(completions))

    reward = rewards.named(mine, "studies/x/rewards.py:mine")
    assert reward.__name__ == "mine"
    with pytest.raises(rewards.RewardError, match=f"reward studies/x/rewards.py:mine {re.escape(message)}"):
        reward(prompts=["a", "b"], completions=["x", "y"])
    assert rewards.named(lambda completions, **k: [0.5, None], "f")(completions=["x", "y"]) == [0.5, None]
