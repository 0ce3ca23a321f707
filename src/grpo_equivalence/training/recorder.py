"""The recorder of a run's statistics (analysis.stats holds the contract): one record per optimizer step, with every
log dict the trainer wrote for it, its wall time, memory and the time TRL's profiled blocks took."""

import contextlib
import time

from ..analysis.stats import PROFILE, STEP_KEYS

# Trainer log keys promoted out of `metrics` into the step record (`kl` is the workflow's own, training.kl: the
# stack's logged kl goes to LOGGED_KL)
PROMOTED = ("loss", "grad_norm", "reward")
LOGGED_KL = "kl_logged"  # the KL the trainer stack logged under its own definition (TRL's, Unsloth's)
KL_PARTS = ("kl_sum", "kl_tokens", "kl_s")  # training.kl's figures of a step, while it runs


# Keys of the trainer's closing log (run totals, not a step's figures).
RUN_SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss")


# What the recorder measures per step: "full" (the contract: wall time between synchronised bounds, memory,
# TRL's block timings, the trainer's logs) or "timestamps" (the trainer's logs and the time between two
# step ends, no synchronisation, no memory: as near to no recorder as a run that is still timed can be).
# "alternate" does the full recorder's work on odd steps only and times every step from the previous step's
# end, so that one run holds both and their ratio is free of the run-to-run noise of two runs. The last two
# exist to measure the full recorder's own cost (benchmarks/callback_overhead.py). The schema's `recorder`
# lists them.


def make_recorder(memory_probe, synchronize=lambda: None, mode: str = "full"):
    """A TrainerCallback that builds one record per optimizer step.

    Every log dict is merged into the record of the step it belongs to: GRPO logs its metrics in
    several dicts, and keeping only the dict that holds `loss` would drop the others (a trap of the
    original study). Wall time and memory span on_step_begin..on_step_end, which holds generation,
    reward scoring, forward, backward and the optimizer step.
    """
    from transformers import TrainerCallback

    class StepRecorder(TrainerCallback):
        def __init__(self):
            self.records: dict[int, dict] = {}
            self.run_summary: dict = {}
            self._start = None
            self._step = 0

        def on_train_begin(self, args, state, control, **kwargs):
            self._last_end = time.perf_counter()

        def _works(self, step: int) -> bool:
            """Whether this step gets the full recorder's synchronisation and memory readings."""
            return mode == "full" or (mode == "alternate" and step % 2 == 1)

        def on_step_begin(self, args, state, control, **kwargs):
            self._step = state.global_step + 1
            if not self._works(self._step):
                return
            synchronize()
            memory_probe.reset()
            self._start = time.perf_counter()

        def add_kl(self, total: float, tokens: int, seconds: float) -> None:
            """The step's KL as training.kl computes it, a loss computation at a time, and the time it took."""
            record = self.records.setdefault(self._step, {"step": self._step})
            for key, value in zip(KL_PARTS, (total, tokens, seconds), strict=True):
                record[key] = record.get(key, 0) + value

        def add_profile(self, name: str, seconds: float) -> None:
            profile = self.records.setdefault(self._step, {"step": self._step}).setdefault(PROFILE, {})
            profile[name] = profile.get(name, 0.0) + seconds

        def on_step_end(self, args, state, control, **kwargs):
            record = self.records.setdefault(state.global_step, {"step": state.global_step})
            if mode != "full":
                if self._works(state.global_step):
                    synchronize()
                    record.update(memory_probe.read())
                now = time.perf_counter()
                record["wall_s"], self._last_end = now - self._last_end - record.get("kl_s", 0.0), now
                return
            synchronize()
            # the workflow's own KL computation is not the step's work
            record["wall_s"] = time.perf_counter() - self._start - record.get("kl_s", 0.0)
            record.update(memory_probe.read())

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = dict(logs or {})
            if any(key in logs for key in RUN_SUMMARY_KEYS):
                self.run_summary.update(logs)
                return
            record = self.records.setdefault(state.global_step, {"step": state.global_step})
            record.setdefault("metrics", {}).update(logs)

    return StepRecorder()


@contextlib.contextmanager
def trl_profiling(recorder):
    """Within the block, the durations TRL measures with its profiling contexts reach `recorder` (TRL itself
    reports them only to W&B, MLflow or Trackio): where a step's time goes, generation or training."""
    from trl.extras import profiling

    original = profiling.ProfilingContext._log_metrics

    def log_metrics(context, duration):
        recorder.add_profile(context.name, duration)
        return original(context, duration)

    profiling.ProfilingContext._log_metrics = log_metrics
    try:
        yield
    finally:
        profiling.ProfilingContext._log_metrics = original


def step_records(records: dict[int, dict]) -> list[dict]:
    """Records in step order, with the contract's keys at top level and the rest under `metrics`: `kl` the
    workflow's own (None where it could not compute it), the stack's logged one as LOGGED_KL, and the seconds the
    computation took (left out of wall_s) as metrics.kl_compute_s."""
    steps = []
    for step in sorted(records):
        raw = dict(records[step])
        metrics = raw.pop("metrics", {})
        total, tokens, seconds = (raw.pop(key, None) for key in KL_PARTS)
        record = {key: None for key in STEP_KEYS}
        record.update(raw)
        for key in PROMOTED:
            record[key] = metrics.pop(key, None)
        record["kl"] = total / tokens if tokens else None
        record[LOGGED_KL] = metrics.pop("kl", None)
        if seconds is not None:
            metrics["kl_compute_s"] = seconds
        record["metrics"] = metrics
        steps.append(record)
    return steps

