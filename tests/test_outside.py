"""The study as TRL users write it: the workflow used as a Snakemake module from a folder of the user's, with a
reward function from a file beside the study, a backend that an installed package adds (entry point), a
GRPOConfig field of TRL's own and the adapters kept; and the checks each of those gets before any job.

The "installed package" is a real distribution on the path (a dist-info with its entry_points.txt, as pip
leaves one), made by the test in a scratch folder.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, copy_tiny, tiny_yaml
from grpo_equivalence.study.config import ConfigError
from grpo_equivalence.study.validate import check
from grpo_equivalence.training import reward_code, rewards
from helpers import SMALL_ROLLOUT_CHECK

REWARD_FILE = '''
from my_helper import bonus


def length_penalty(completions, **kwargs):
    """Shorter is better: a user's own reward, named by file in the study, with a module of theirs beside it."""
    return [-0.01 * len(c[0]["content"] if isinstance(c, list) else c) + bonus() for c in completions]
'''
HELPER_FILE = "def bonus():\n    return 0.0\n"

def readme_plugin() -> tuple[str, str]:
    """The documented example of a backend from outside (docs/backends.md): its module, and its entry point line."""
    section = (ROOT / "docs" / "backends.md").read_text().split("## Backends from outside", 1)[1]
    module = section.split("```python\n", 1)[1].split("```", 1)[0]
    toml = section.split("```toml\n", 1)[1].split("```", 1)[0]
    return module, toml.strip().splitlines()[-1]


def install_plugin(site: Path) -> None:
    """A distribution on `site` that adds the documented backend (greedy_hf) through the entry point group."""
    module, entry = readme_plugin()
    (site / "my_backend").mkdir(parents=True)
    (site / "my_backend" / "__init__.py").write_text(module)
    info = site / "my_backend_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-backend-pkg\nVersion: 0.1\n")
    name, target = (part.strip().strip('"') for part in entry.split("="))
    (info / "entry_points.txt").write_text(f"[grpo_equivalence.backends]\n{name} = {target}\n")
    (info / "RECORD").write_text("")


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory, tiny_results):
    """A user's project: a Snakefile that uses this workflow as a module, their study, reward file and package."""
    folder = tmp_path_factory.mktemp("user")
    copy_tiny(tiny_results, folder)  # primed once
    install_plugin(folder / "site")
    (folder / "my_rewards.py").write_text(REWARD_FILE)
    (folder / "my_helper.py").write_text(HELPER_FILE)
    study = tiny_yaml()
    study.update(backends=["hf", "greedy_hf"], reference="hf", steps=[4], replicates={"reference": 1, "others": 1},
                 rollout_check=SMALL_ROLLOUT_CHECK, trainer_check=False, rewards=["study", "my_rewards.py:length_penalty"],
                 save_adapters=True)
    study["grpo"].update(reward_weights=[1.0, 1.0, 1.0, 1.0, 0.5], adam_beta2=0.99)  # adam_beta2: TRL's own field
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    (folder / "Snakefile").write_text(f'''configfile: "study.yaml"


module grpo:
    snakefile:
        "{ROOT / "Snakefile"}"
    config:
        config


use rule * from grpo
''')
    return folder


def user_env(folder: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder / "site"), os.environ.get("PYTHONPATH")]))}


def snakemake(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args],  # the default target: the report
                          cwd=folder, capture_output=True, text=True, env=user_env(folder))


@pytest.fixture(scope="module")
def ran(user_folder):
    result = snakemake(user_folder)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return user_folder


def run_of(folder: Path, backend: str) -> dict:
    return json.loads((folder / f"results/stats/grpo_{backend}_4.json").read_text())


pytestmark = pytest.mark.workflow


def test_a_module_import_plans_and_runs_the_tiny_study(ran):
    assert (ran / "results/grpo_equivalence.md").exists()
    assert (ran / "results/benchmarks/train/hf_4.tsv").read_text().startswith("s\t")  # Snakemake's own figures


def test_an_entry_point_backend_trains(ran):
    """The documented example (docs/backends.md): hf with greedy decoding, from an installed package."""
    run = run_of(ran, "greedy_hf")
    assert run["backend"] == "greedy_hf" and len(run["steps"]) == 4
    assert run["effective_config"]["generation"]["do_sample"] is False
    assert run["effective_config"]["rollout_settings"] == ["generation.do_sample"]
    assert "| greedy_hf |" in (ran / "results/grpo_equivalence.md").read_text()


def test_a_reward_function_from_a_file_is_trained_with_recorded_and_compared(ran):
    for backend in ("hf", "greedy_hf"):
        run = run_of(ran, backend)
        assert all("rewards/length_penalty/mean" in s["metrics"] for s in run["steps"])
        assert run["effective_config"]["trainer"]["reward_weights"] == [1.0, 1.0, 1.0, 1.0, 0.5]
        assert run["effective_config"]["trainer"]["adam_beta2"] == 0.99
    report = (ran / "results/grpo_equivalence.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| Candidate | match_format_exactly"))
    assert "length_penalty" in header  # judged like any metric, beside the study's four


def test_a_saved_adapter_loads_with_peft(ran):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder = ran / "results/adapters/hf_4"
    assert (folder / "adapter_config.json").exists()
    base = AutoModelForCausalLM.from_pretrained(ran / "results/tiny/primed", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, folder)
    trained = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert trained and any(p.abs().sum() > 0 for p in trained)  # LoRA's B starts at zero: these were trained


# my_rewards.py imports my_helper beside it: a change there changes the reward as much as one in the reward file
@pytest.mark.parametrize("name, old, new", [("my_rewards.py", "-0.01", "-0.02"), ("my_helper.py", "0.0", "0.5")])
def test_a_changed_reward_file_or_module_it_imports_reruns_the_train_jobs(ran, name, old, new):
    path = ran / name
    saved = path.read_text()
    path.write_text(saved.replace(old, new))
    try:
        plan = snakemake(ran, "--dry-run")
        assert plan.returncode == 0, plan.stderr[-2000:]
        assert "results/stats/grpo_hf_4.json" in plan.stdout and "results/stats/grpo_greedy_hf_4.json" in plan.stdout
    finally:
        path.write_text(saved)


def test_the_reward_file_s_local_imports_are_found(ran):
    assert [p.name for p in reward_code.local_imports(ran / "my_rewards.py")] == ["my_helper.py"]


# --- Checked before any job -------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, spec, message", [
    ("def score(completions):\n    return [0.0]\n", "r.py:score", "'r.py:score' must take **kwargs"),
    ("x = 1\n", "r.py:score", "r.py has no 'score'"),
    ("raise RuntimeError('boom')\n", "r.py:score", "importing 'r.py:score' failed (RuntimeError: boom)"),
    ("", "no_such_module:score", "module no_such_module cannot be imported"),
    ("", "r.py", "is not MODULE:FUNCTION or FILE.py:FUNCTION"),
    ("", "missing.py:score", "missing.py does not exist"),
])
def test_a_bad_reward_function_is_refused_in_one_line_naming_the_key(tiny_config, tmp_path, source, spec, message):
    (tmp_path / "r.py").write_text(source)
    tiny_config["rewards"] = ["study", spec]
    with pytest.raises(ConfigError) as error:
        check(tiny_config, [tmp_path])
    assert "rewards" in str(error.value) and message in str(error.value)


def test_reward_weights_must_be_one_per_function_and_names_unique(tiny_config, tmp_path):
    (tmp_path / "r.py").write_text("def check_answer(completions, **kwargs):\n    return [0.0]\n")
    tiny_config["rewards"] = ["study", "r.py:check_answer"]
    with pytest.raises(ConfigError, match="check_answer named twice"):
        check(tiny_config, [tmp_path])
    tiny_config["rewards"] = ["study"]
    tiny_config["grpo"]["reward_weights"] = [1.0, 2.0]
    with pytest.raises(ConfigError, match=r"grpo.reward_weights: 2 weight\(s\) for 4 reward function\(s\)"):
        check(tiny_config, [tmp_path])


def test_the_chat_template_is_the_models_own_unless_the_study_names_one(tmp_path):
    from transformers import AutoTokenizer

    from grpo_equivalence.training import tiny
    from grpo_equivalence.training.answer_format import CHAT_TEMPLATE
    from grpo_equivalence.training.session import use_chat_template

    tiny.save_model(tmp_path / "m", hidden_size=16, num_layers=1, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    own = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer.chat_template = own
    use_chat_template(tokenizer, None)
    assert tokenizer.chat_template == own  # an instruct model keeps its own
    use_chat_template(tokenizer, "study")
    assert tokenizer.chat_template == CHAT_TEMPLATE
    (tmp_path / "t.jinja").write_text(own + "!")
    use_chat_template(tokenizer, str(tmp_path / "t.jinja"))
    assert tokenizer.chat_template == own + "!"
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template; set chat_template"):
        use_chat_template(tokenizer, None)


def test_a_broken_entry_point_backend_names_itself(tmp_path, monkeypatch):
    from grpo_equivalence.training import backends

    install_plugin(tmp_path)
    (tmp_path / "my_backend" / "__init__.py").write_text("raise ImportError('needs my_lib')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    backends._plugins.cache_clear()
    try:
        assert "greedy_hf" in backends.names()
        with pytest.raises(backends.BackendUnavailable, match="backend 'greedy_hf' .* cannot be loaded: ImportError: needs my_lib"):
            backends.get("greedy_hf")
    finally:
        backends._plugins.cache_clear()


def test_the_studys_reward_set_is_the_original_four():
    functions = rewards.load([rewards.STUDY_SET], "<eos>")
    assert tuple(f.__name__ for f in functions) == rewards.REWARD_NAMES
