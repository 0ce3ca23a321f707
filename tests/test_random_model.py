"""Models of a real architecture with random weights (model: random): built, checked, and trained through
Snakemake on a small architecture (the real ones, 0.6B and 4B parameters, are for GPU boxes)."""

import json
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT
from grpo_equivalence.analysis import stats
from grpo_equivalence.study.config import ConfigError
from grpo_equivalence.study.validate import check
from grpo_equivalence.training import random_model

SMALL = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "max_position_embeddings": 512, "tie_word_embeddings": True, "vocab_size": 384, "rope_theta": 1000000}


@pytest.mark.parametrize("name, parameters", [("qwen3-4b", 4.02e9), ("qwen3-0.6b", 0.596e9)])
def test_shipped_architectures_have_the_published_size(name, parameters):
    """Parameter count from the shape alone (no weights built): embedding, attention, MLP, norms."""
    c = random_model.load_architecture(ROOT / "studies" / "architectures" / f"{name}.json")
    q, kv, d = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"], c["hidden_size"]
    layer = d * (q + 2 * kv) + q * d + 3 * d * c["intermediate_size"] + 2 * d + 2 * c["head_dim"]
    total = c["vocab_size"] * d + c["num_hidden_layers"] * layer + d
    assert total == pytest.approx(parameters, rel=0.01)


def test_a_random_model_loads_back_with_a_full_size_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    count = random_model.save(SMALL, tmp_path, tokenizer_size=300, dtype="float32", seed=0)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 300 and model.get_input_embeddings().weight.shape[0] == 384
    assert count == sum(p.numel() for p in model.parameters())
    assert tokenizer.decode(tokenizer("<SOLUTION>7</SOLUTION>", add_special_tokens=False)["input_ids"]) == "<SOLUTION>7</SOLUTION>"
    assert tokenizer.chat_template and model.generation_config.eos_token_id == tokenizer.eos_token_id


def speed_study(tmp_path, **changes) -> dict:
    study = yaml.safe_load((ROOT / "studies" / "speed-4b.yaml").read_text())
    (tmp_path / "small.json").write_text(json.dumps(SMALL))
    study["random_model"].update(architecture=str(tmp_path / "small.json"), tokenizer_size=300)
    study.update(changes)
    return study


def test_the_speed_studies_are_valid():
    for name in ("speed-4b", "speed-0.6b"):
        check(yaml.safe_load((ROOT / "studies" / f"{name}.yaml").read_text()))


@pytest.mark.parametrize("change, message", [
    (lambda s, d: s["random_model"].update(architecture=str(d / "none.json")), "none.json not found"),
    (lambda s, d: s["random_model"].update(tokenizer_size=400), "400 tokens do not fit the architecture's 384"),
    (lambda s, d: s.pop("random_model"), 'model is "random" but random_model.architecture is not set'),
])
def test_a_bad_random_model_is_named_before_any_job(tmp_path, change, message):
    study = speed_study(tmp_path)
    change(study, tmp_path)
    with pytest.raises(ConfigError, match=message):
        check(study)


@pytest.mark.workflow
def test_a_random_model_trains_through_the_workflow(tmp_path):
    study = speed_study(tmp_path, backends=["hf"], reference="hf", steps=[4], gpus_per_train_job=0, dtype="float32",
                        train_threads=2, max_seq_length=256)
    study["grpo"].update(max_completion_length=16, per_device_train_batch_size=4)
    study["results"] = "results"
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    result = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
                             "results/stats/grpo_hf_4.json", "--cores", "2", "--config", f"study={tmp_path / 'study.yaml'}"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "parameters, random" in (tmp_path / "results/logs/prepare_random_model.log").read_text()
    run = stats.load(tmp_path / "results/stats/grpo_hf_4.json")
    assert run["model"] == "random" and run["model_path"] == "results/random/model"
    # random weights rarely stop: completions run to max_completion_length
    assert all(step["metrics"]["completions/max_length"] == 16 for step in run["steps"])
