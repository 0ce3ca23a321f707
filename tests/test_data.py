"""The data set and the rewards as TRL's GRPOTrainer passes them: every column to every reward function, prompts as
text or chat messages, no answer column where no reward needs one; checked before any job where the data set is on
this machine, at the job's start where it is not; the rollout check scoring through TRL's own reward path."""

import json

import pytest

from grpo_equivalence.study.config import ConfigError
from grpo_equivalence.study.validate import check
from grpo_equivalence.training.data import load_problems

SYSTEM = "the study's system prompt"


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"path": "json", "data_files": str(path)}


def test_every_column_reaches_the_rewards_and_text_prompts_become_chat_messages(tmp_path):
    dataset = write(tmp_path / "d.jsonl", [{"question": "1+1", "solution": 2, "difficulty": 3}])
    row = load_problems({**dataset, "prompt_column": "question"}, system_prompt=SYSTEM)[0]
    assert row["prompt"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "1+1"}]
    assert (row["answer"], row["solution"], row["difficulty"], row["question"]) == ("2", 2, 3, "1+1")


def test_chat_message_prompts_keep_their_own_system_prompt_and_get_the_studys_where_they_have_none(tmp_path):
    own = [{"role": "system", "content": "theirs"}, {"role": "user", "content": "2+2"}]
    dataset = write(tmp_path / "d.jsonl", [{"prompt": own}, {"prompt": [{"role": "user", "content": "1+1"}]}])
    rows = load_problems(dataset, system_prompt=SYSTEM)
    assert rows[0]["prompt"] == own
    assert rows[1]["prompt"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "1+1"}]
    assert "answer" not in rows.column_names  # no answer column: none made up


def test_max_prompt_tokens_drops_the_long_prompts(tmp_path):
    from grpo_equivalence.training import tiny
    from grpo_equivalence.training.answer_format import CHAT_TEMPLATE

    tokenizer = tiny.build_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    dataset = write(tmp_path / "d.jsonl", [{"prompt": "1+1", "solution": "2"}, {"prompt": "1+1" * 30, "solution": "2"}])
    rows = load_problems({**dataset, "max_prompt_tokens": len(SYSTEM) + 40}, system_prompt=SYSTEM, tokenizer=tokenizer)
    assert [row["prompt"][1]["content"] for row in rows] == ["1+1"]


def study_with(tiny_config, tmp_path, rows, rewards=None):
    tiny_config.update(dataset=write(tmp_path / "data.jsonl", rows))
    if rewards is not None:
        (tmp_path / "mine.py").write_text(rewards)
        tiny_config.update(rewards=[f"{tmp_path / 'mine.py'}:{name}" for name in ("by_difficulty",)])
    return tiny_config


BY_DIFFICULTY = "def by_difficulty(completions, difficulty, **kwargs):\n    return [float(d) for d in difficulty]\n"


def test_a_reward_taking_a_column_the_data_lacks_is_refused_before_any_job(tiny_config, tmp_path):
    study_with(tiny_config, tmp_path, [{"prompt": "1+1", "solution": "2"}] * 4, BY_DIFFICULTY)
    with pytest.raises(ConfigError, match="reward 'by_difficulty' takes 'difficulty', a column the data set does not "
                                          "have \\(its columns: answer, prompt, solution\\)"):
        check(tiny_config, [tmp_path])
    study_with(tiny_config, tmp_path, [{"prompt": "1+1", "solution": "2", "difficulty": 1}] * 4, BY_DIFFICULTY)
    check(tiny_config, [tmp_path])


def test_a_data_set_without_an_answer_column_plans_where_no_reward_needs_one(tiny_config, tmp_path):
    study_with(tiny_config, tmp_path, [{"prompt": [{"role": "user", "content": "1+1"}], "difficulty": 1}] * 4,
               BY_DIFFICULTY)
    check(tiny_config, [tmp_path])
    tiny_config.update(rewards=["study"])  # the study's four take the answer
    with pytest.raises(ConfigError, match="reward 'check_answer' takes 'answer'"):
        check(tiny_config, [tmp_path])


def test_a_prompt_that_is_neither_text_nor_chat_messages_is_refused_before_any_job(tiny_config, tmp_path):
    study_with(tiny_config, tmp_path, [{"prompt": [{"text": "1+1"}], "solution": "2"}])
    with pytest.raises(ConfigError, match="column 'prompt' of its first row: a prompt's chat message is"):
        check(tiny_config, [tmp_path])


REWARDS = '''
def by_difficulty(completions, difficulty, completion_ids, **kwargs):
    return [float(d) for d, ids in zip(difficulty, completion_ids, strict=True)]


def not_applicable(completions, **kwargs):
    return [None] * len(completions)
'''


@pytest.mark.workflow
def test_the_rollout_check_scores_rewards_as_training_does(primed, tiny_config, tmp_path):
    """Columns and completion_ids reach the rewards, reward_weights weigh them, a reward of None counts as TRL
    counts it (left out of the sum; a completion no function scored is unscorable, NaN), as in training."""
    import copy
    import math

    from grpo_equivalence.checks import rollout, rollout_verdict
    from grpo_equivalence.study.config import rollout_check_settings

    rows = [{**json.loads(line), "difficulty": i % 3}
            for i, line in enumerate(open(primed["dataset"]["data_files"]).readlines()[:8])]
    dataset = write(tmp_path / "data.jsonl", rows)
    (tmp_path / "mine.py").write_text(REWARDS)
    config = copy.deepcopy(tiny_config)
    config["rollout_check"] = rollout_check_settings({"prompts": 8, "prompts_per_call": 8})
    config["rewards"] = ["study", f"{tmp_path / 'mine.py'}:by_difficulty", f"{tmp_path / 'mine.py'}:not_applicable"]
    config["grpo"]["reward_weights"] = [0, 0, 0, 0, 2, 1]
    run = rollout.check(config, "hf", model_path=primed["model"], dataset=dataset, out=tmp_path / "hf.json", seed=1,
                        log=lambda message: None)
    assert [c["reward"] for c in run["completions"]] == [2.0 * (c["prompt"] % 3) for c in run["completions"]]
    config["rewards"] = [f"{tmp_path / 'mine.py'}:not_applicable"]
    config["grpo"]["reward_weights"] = None
    none = rollout.check(config, "hf", model_path=primed["model"], dataset=dataset, out=tmp_path / "none.json", seed=1,
                         log=lambda message: None)
    assert all(math.isnan(c["reward"]) for c in none["completions"])
    loaded = rollout.load(tmp_path / "none.json")  # written and read back as the report reads it
    assert rollout_verdict.totals(loaded)["unscorable"] == len(loaded["completions"])
    test = rollout_verdict.paired_test(rollout_verdict.totals(run), rollout_verdict.totals(loaded), "reward",
                                       alpha=0.05, margin_sd=0.1)
    assert test["no_variation"] and "every reward function returned None" in test["reason"]


@pytest.mark.workflow
@pytest.mark.quick
def test_the_workflow_builds_the_tiny_data_set_and_model_then_has_nothing_to_do(tmp_path):
    """The quick tier's one small workflow: a real Snakemake run of the tiny study's first two jobs (its data set in
    the study's answer format and its model, each job with its log), read back as a train job reads them, and a
    second run with nothing to do."""
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import ROOT

    targets = ["results/tiny/data/train.jsonl", "results/tiny/model"]

    def snakemake():
        return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
                               str(tmp_path), *targets, "--cores", "1", "--config",
                               f"study={ROOT / 'studies' / 'tiny.yaml'}"], capture_output=True, text=True)

    first = snakemake()
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 of 2 steps (100%) done" in first.stderr
    rows = load_problems({"path": "json", "data_files": str(tmp_path / targets[0])}, system_prompt=SYSTEM)
    assert len(rows) > 1 and {"prompt", "solution", "answer"} <= set(rows.column_names)
    assert all(row["prompt"][0] == {"role": "system", "content": SYSTEM} for row in rows)
    assert all(row["answer"] == str(sum(map(int, row["prompt"][-1]["content"].split("+")))) for row in rows)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / targets[1])
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / targets[1])
    assert model.config.model_type == "qwen3" and model.config.vocab_size >= len(tokenizer)
    assert {p.name for p in (tmp_path / "results" / "logs").iterdir()} == {"prepare_data.log", "prepare_model.log"}
    again = snakemake()
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
