import re

import pytest
import yaml

from conftest import ROOT
from grpo_equivalence.study.config import ConfigError
from grpo_equivalence.study.validate import check


def problems_of(config) -> str:
    with pytest.raises(ConfigError) as error:
        check(config)
    return str(error.value)


def test_tiny_study_is_valid(tiny_config):
    check(tiny_config)


def test_unknown_top_level_key_is_named_with_the_fix(tiny_config):
    tiny_config["bakends"] = ["hf"]
    message = problems_of(tiny_config)
    assert "bakends: unknown setting; remove it or fix its spelling" in message


def test_unknown_grpo_key_is_named_with_its_path(tiny_config):
    """Any field of the installed TRL's GRPOConfig is a setting; a misspelt one is not, and its near names show."""
    tiny_config["grpo"]["lerning_rate"] = 1e-5
    assert "grpo.lerning_rate: not a field of trl" in problems_of(tiny_config)
    assert "(close: learning_rate" in problems_of(tiny_config)


def test_missing_grpo_setting_is_required(tiny_config):
    del tiny_config["grpo"]["beta"]
    message = problems_of(tiny_config)
    assert "grpo: 'beta' is a required property" in message


def test_unknown_backend(tiny_config):
    tiny_config["backends"] = ["hf", "sglang"]
    message = problems_of(tiny_config)
    assert "backends: unknown backend 'sglang'; choose among" in message and "cb_paged" in message


def test_reference_not_among_backends(tiny_config):
    tiny_config["reference"] = "cb_paged"
    tiny_config["backends"] = ["hf"]
    assert "reference: 'cb_paged' is not among backends ['hf']" in problems_of(tiny_config)


def test_step_count_too_small_for_the_warm_up_skip(tiny_config):
    tiny_config["steps"] = [3, 10]
    message = problems_of(tiny_config)
    assert "steps: 3 leaves no step for the median step time after median_skip_steps=3" in message
    assert "steps: 10" not in message


def test_num_generations_must_divide_the_batch(tiny_config):
    tiny_config["grpo"]["num_generations"] = 3
    message = problems_of(tiny_config)
    assert "grpo.num_generations: 3 does not divide" in message and "= 8" in message


def test_unknown_backend_option(tiny_config):
    tiny_config["backend_options"]["cb_paged"]["page_size"] = 4
    assert "backend_options.cb_paged.page_size: unknown option of cb_paged" in problems_of(tiny_config)


def test_a_backend_flag_is_true_or_false(tiny_config):
    tiny_config["backend_options"]["trl_vllm"] = {"exact_top_p": "yes"}
    message = problems_of(tiny_config)
    assert "backend_options.trl_vllm.exact_top_p: 'yes' is neither true nor false; exact_top_p: true:" in message
    tiny_config["backend_options"]["trl_vllm"] = {"exact_top_p": True}
    check(tiny_config)


def test_wrong_type_names_the_key(tiny_config):
    tiny_config["grpo"]["temperature"] = "hot"
    assert "grpo.temperature: 'hot' is not of type 'number'" in problems_of(tiny_config)


def test_all_problems_are_reported_at_once(tiny_config):
    tiny_config["reference"] = "vllm_server"
    tiny_config["steps"] = [2]
    message = problems_of(tiny_config)
    assert "reference:" in message and "steps: 2" in message


def test_the_study_config_is_valid():
    check(yaml.safe_load((ROOT / "config.yaml").read_text()))


def test_a_studys_results_folder_is_its_own_by_default_and_never_a_shared_one():
    from grpo_equivalence.study.config import results_folder

    assert results_folder({}, "studies/word-problems.yaml") == "results/word-problems"  # the file's name
    assert results_folder({"name": "mine"}, "studies/study.yaml") == "results/mine"  # the study's name first
    assert results_folder({"results": "out/a"}, "studies/study.yaml") == "out/a"
    assert results_folder(yaml.safe_load((ROOT / "config.yaml").read_text()), ROOT / "config.yaml") == "results"
    for config, said in (({"results": "results/cache/mine"}, "results: 'results/cache/mine' lies in results/cache"),
                         ({"name": "tracking"}, "here results/tracking): 'results/tracking' lies in results/tracking"),
                         ({"results": "results/{x}"}, "has a brace")):
        with pytest.raises(ConfigError, match=re.escape(said)):
            results_folder(config, "study.yaml")
