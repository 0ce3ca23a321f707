import json
import math
from types import SimpleNamespace

import pytest

from grpo_equivalence.analysis import stats
from grpo_equivalence.training import recorder as recording
from helpers import make_stats


class FakeProbe:
    def __init__(self):
        self.resets = 0

    def reset(self):
        self.resets += 1

    def read(self):
        return {"peak_mem_gb": 0.5 + self.resets}


def drive(recorder, steps):
    """Calls the callback in the order transformers' Trainer does: begin, end, then the step's logs."""
    state = SimpleNamespace(global_step=0)
    for step_logs in steps:
        recorder.on_step_begin(None, state, None)
        state.global_step += 1
        recorder.on_step_end(None, state, None)
        for logs in step_logs:
            recorder.on_log(None, state, None, logs=logs)
    recorder.on_log(None, state, None, logs={"train_runtime": 3.0, "train_loss": 0.1})
    return state


def test_every_log_dict_is_merged_into_its_step():
    recorder = recording.make_recorder(FakeProbe())
    drive(recorder, [
        [{"loss": 0.5, "grad_norm": 2.0}, {"reward": 1.0, "kl": 0.01, "entropy": 0.9}],
        [{"reward": 2.0}, {"loss": 0.4, "grad_norm": 1.0, "completions/mean_length": 12.0}],
    ])
    steps = recording.step_records(recorder.records)
    assert [s["step"] for s in steps] == [1, 2]
    # the trainer's kl is the stack's logged one; kl is the workflow's own (none computed here: null)
    assert steps[0]["loss"] == 0.5 and steps[0]["reward"] == 1.0 and steps[0]["kl_logged"] == 0.01
    assert steps[0]["kl"] is None
    assert steps[0]["metrics"] == {"entropy": 0.9}
    assert steps[1]["metrics"] == {"completions/mean_length": 12.0}
    assert steps[1]["peak_mem_gb"] == 2.5 and steps[1]["wall_s"] >= 0


def test_a_metric_never_logged_is_null_not_zero():
    recorder = recording.make_recorder(FakeProbe())
    drive(recorder, [[{"loss": 0.5, "reward": 1.0}]])  # beta = 0: TRL logs no kl
    (step,) = recording.step_records(recorder.records)
    assert step["kl"] is None and step["kl_logged"] is None and step["grad_norm"] is None


def test_the_closing_log_is_the_runs_not_a_steps():
    recorder = recording.make_recorder(FakeProbe())
    drive(recorder, [[{"loss": 0.5}]])
    (step,) = recording.step_records(recorder.records)
    assert "train_runtime" not in step["metrics"] and recorder.run_summary["train_runtime"] == 3.0


def test_write_then_load_round_trips(tmp_path):
    data = make_stats()
    stats.write(tmp_path / "s.json", data)
    assert stats.load(tmp_path / "s.json") == data
    assert not list(tmp_path.glob("*.partial"))


def test_a_nan_is_kept_as_it_was_logged(tmp_path):
    data = make_stats(loss=lambda i: float("nan") if i == 2 else 0.1)
    stats.write(tmp_path / "s.json", data)
    assert math.isnan(stats.load(tmp_path / "s.json")["steps"][1]["loss"])


def test_a_numpy_or_torch_nan_is_written_as_the_contracts_nan(tmp_path):
    """np.float32 is not a float: written through str() it became "nan", which the contract does not know."""
    import numpy as np
    import torch

    data = make_stats()
    data["steps"][1]["metrics"].update(entropy=np.float32("nan"), kl_extra=np.float64(0.5), t=torch.tensor(2.5).item(),
                                       big=np.float32("inf"))
    stats.write(tmp_path / "s.json", data)
    raw = json.loads((tmp_path / "s.json").read_text())["steps"][1]["metrics"]
    assert raw["entropy"] == "NaN" and raw["big"] == "Infinity" and raw["kl_extra"] == 0.5
    assert math.isnan(stats.load(tmp_path / "s.json")["steps"][1]["metrics"]["entropy"])


def test_a_0_d_tensor_or_array_metric_is_written_as_its_number(tmp_path):
    """A metric logged as torch.tensor(x) (no .item()) or a 0-d numpy array: its number, NaN as the contract's NaN,
    never its str() ("tensor(nan)")."""
    import numpy as np
    import torch

    data = make_stats()
    data["steps"][1]["metrics"].update(t_nan=torch.tensor(float("nan")), t=torch.tensor(2.5, dtype=torch.bfloat16),
                                       a=np.array(0.25), steps=torch.tensor(3))
    stats.write(tmp_path / "s.json", data)
    raw = json.loads((tmp_path / "s.json").read_text())["steps"][1]["metrics"]
    assert (raw["t_nan"], raw["t"], raw["a"], raw["steps"]) == ("NaN", 2.5, 0.25, 3)
    assert math.isnan(stats.load(tmp_path / "s.json")["steps"][1]["metrics"]["t_nan"])


@pytest.mark.parametrize(
    "break_it, expected",
    [
        (lambda d: d.pop("environment"), "missing run key(s) environment"),
        (lambda d: d.update(schema_version=2), "schema_version 2, expected 1"),
        (lambda d: d["steps"].pop(2), "missing [3]"),
        (lambda d: d["steps"].insert(1, dict(d["steps"][0])), "step(s) [1] appear more than once"),
        (lambda d: d["steps"][0].pop("kl"), "step 1 lacks kl (use null for a metric not logged)"),
    ],
)
def test_contract_violations_are_named(tmp_path, break_it, expected):
    data = make_stats()
    break_it(data)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    with pytest.raises(stats.StatsError, match=None) as error:
        stats.load(path)
    assert expected in str(error.value) and str(path) in str(error.value)


def test_truncated_file_says_to_rerun(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"schema_version": 1, "steps": [')
    with pytest.raises(stats.StatsError, match="rerun the train job"):
        stats.load(path)
