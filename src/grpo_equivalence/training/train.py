"""One GRPO training run: a backend, a step count, and the study's settings; writes the statistics file."""

import contextlib
import os
import sys
import time
from pathlib import Path

from ..analysis import stats
from ..runtime import environment, memory, paths
from . import backends, faults, kl
from .recorder import make_recorder, step_records, trl_profiling
from .session import device_for, session

# Trainer arguments left out of `effective_config`: paths that differ per run by construction.
UNRECORDED_ARGS = ("output_dir", "logging_dir", "run_name")


TRACKING = Path(paths.TRACKING)


def tracked(config: dict, backend_name: str, max_steps: int, study: str, root: Path = TRACKING) -> dict:
    """The run's name and project for the trackers (TensorBoard, Trackio, W&B offline), with each one pointed at
    `root` on this machine: a run is named {backend}_{steps}_seed{seed} and grouped by study."""
    run_name = f"{backend_name}_{max_steps}_seed{config['grpo']['seed']}"
    root = Path(root).resolve()
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(root / "tensorboard" / study / run_name)
    os.environ.setdefault("TRACKIO_DIR", str(root / "trackio"))
    os.environ.setdefault("WANDB_MODE", "offline")  # nothing leaves the machine unless the user asks for it
    os.environ.setdefault("WANDB_DIR", str(root))
    os.environ.setdefault("WANDB_PROJECT", study)
    os.environ.setdefault("WANDB_RUN_GROUP", study)
    return {"run_name": run_name, "project": study}


def progress(total: int, label: str, log=print):
    """A TrainerCallback that logs the run's progress: step n of N, seconds a step, time left (every step early on,
    then about fifty lines a run)."""
    from transformers import TrainerCallback

    every = max(1, total // 50)

    class Progress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.began = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step = state.global_step
            if step <= 3 or step % every == 0 or step == total:
                per_step = (time.perf_counter() - self.began) / step
                log(f"{label} step {step} of {total}, {per_step:.2f} s a step, about {per_step * (total - step):.0f} s "
                    f"left")
                sys.stdout.flush()  # the job's log is a file: a line a user waits for must not sit in a buffer

    return Progress()


def run(config: dict, backend_name: str, max_steps: int, *, model_path: str, dataset: dict, out: Path,
        gpu_lease=None, study: str = "study", adapter: Path | None = None, log=print, write=stats.write) -> dict:
    """Trains and writes `out` (with `write`: the train job's also keeps the run where `out` cannot be written).
    `model_path`/`dataset` are the config's, resolved (tiny study: built files). `gpu_lease`: the lease's record,
    or a function that gives it once training is over (which runs shared the GPU meanwhile)."""
    import torch

    device = device_for(config["gpus_per_train_job"])
    backend = backends.get(backend_name)
    backend.check_runnable(device)
    startup_began = time.perf_counter()
    # Before the callbacks below import transformers: Unsloth patches it and TRL at import, and warns that its
    # optimizations may not all apply when they came first (every Unsloth run on the H200 so far did)
    backend.before_trl_import()
    # Start-up (imports, model load, engine start, trainer set-up) is timed on its own: vLLM's engine start
    # takes minutes where a step takes a fraction of a second, and must not be read as training time.
    probe = memory.MemoryProbe(device)
    recorder_mode = config.get("recorder", "full")
    recorder = make_recorder(probe, torch.cuda.synchronize if device == "cuda" else lambda: None,
                                   mode=recorder_mode)
    label = f"[{backend_name} x {max_steps}]"
    with session(config, backend_name, max_steps, model_path=model_path, dataset=dataset,
                 callbacks=[recorder, progress(max_steps, label, log)],
                 tracking=tracked(config, backend_name, max_steps, study), startup_began=startup_began,
                 log=log) as built:
        trainer = built.trainer
        startup_memory = probe.read()  # peaks since the process began, and what is in use before step 1
        log(f"[{backend_name} x {max_steps}] training")
        started_at = time.time()
        start = time.perf_counter()
        startup_s = start - built.startup_began
        with trl_profiling(recorder) if recorder_mode != "timestamps" else contextlib.nullcontext(), \
                kl.computed(trainer, recorder, torch.cuda.synchronize if device == "cuda" else lambda: None):
            trainer.train()
        train_wall = time.perf_counter() - start
        finished_at = time.time()
        # After training, so that it slows no step: against it a decode step's time is judged (summary)
        # Only on a GPU of its own: beside other jobs the figure is theirs too, and freeing its 2 GB could land in
        # a neighbour's vLLM start (quietlock.quiet)
        lease = gpu_lease() if callable(gpu_lease) else gpu_lease
        alone = not lease or lease.get("whole", True)
        bandwidth = memory.device_bandwidth_gbs() if device == "cuda" and alone else None
        warnings = built.warned.records()
        compiled = compile_counts()
        if compiled:
            log(f"{label} torch.compile in this process: {compiled['graphs']} graphs; FX graph cache "
                + ", ".join(f"{n} {k}" for k, n in compiled["fx_graph_cache"].items()) + "; AOT autograd cache "
                + ", ".join(f"{n} {k}" for k, n in compiled["autograd_cache"].items()))
        config_read = {**effective_config(trainer), "rollout_settings": built.rollout_settings,
                       "sampler_seed": config["grpo"]["seed"], "fault": faults.fault_of(backend_name),
                       "configuration": faults.configuration_of(backend_name)}
        model_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
        if adapter is not None:  # the trained LoRA adapter and the tokenizer it was trained with (save_adapters)
            trainer.model.save_pretrained(adapter)
            trainer.processing_class.save_pretrained(adapter)

    steps = step_records(recorder.records)
    peaks = [s["peak_mem_gb"] for s in steps if s["peak_mem_gb"] is not None]
    result = {
        "schema_version": stats.SCHEMA_VERSION,
        "backend": backend_name,
        "max_steps": max_steps,
        "seed": config["grpo"]["seed"],
        "model": config["model"],
        "model_path": model_path,
        "dataset": config["dataset"]["path"],
        "train_wall_s": train_wall,
        # Imports, model load, engine start (vLLM) and trainer set-up, before step 1
        "startup_s": startup_s,
        "startup_memory": startup_memory,
        # Wall-clock bounds of trainer.train() (Unix time): which runs overlapped, on which GPUs
        "train_started_at": started_at,
        "train_finished_at": finished_at,
        "peak_mem_gb": max(peaks) if peaks else None,
        # Bytes of the weights (LoRA adapters included), each read once by a decode step
        "model_bytes": model_bytes,
        "memory_measure": probe.describe(),
        "steps": steps,
        "trainer_summary": recorder.run_summary,
        "warnings": warnings,
        # GRPOConfig keys by name, settings changed on the trainer by their report name (generation.<key>); the
        # seed every sampler of the run was seeded with; an injected fault (None: the backend as it is)
        "effective_config": config_read,
        # the grpo settings as the study asked for them: a run restored from the run cache must have been asked the same
        "requested_grpo": config["grpo"],
        "environment": {**environment.describe(), "gpu_lease": gpu_lease() if callable(gpu_lease) else gpu_lease,
                        "memory_bandwidth_gbs": bandwidth, "torch_compile": compiled,
                        # processes that trained the run together (data parallel, grpo_equivalence.training.parallel)
                        "processes": int(os.environ.get("WORLD_SIZE", "1"))},
    }
    log(f"[{backend_name} x {max_steps}] {len(steps)} steps in {train_wall:.1f} s -> {out}")
    write(out, result)
    return result


def compile_counts() -> dict | None:
    """What torch.compile did in this process: its graphs, and how many of their compilations the shared caches
    served (hit), had to make (miss) or could not hold (bypass); a first step that stays slow with a warm cache
    shows why here. None where nothing was compiled."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # a torch without dynamo
        return None
    graphs = counters["stats"].get("unique_graphs", 0)
    if not graphs:
        return None
    kinds = ("hit", "miss", "bypass")
    return {"graphs": graphs,
            "fx_graph_cache": {k: counters["inductor"].get(f"fxgraph_cache_{k}", 0) for k in kinds},
            "autograd_cache": {k: counters["aot_autograd"].get(f"autograd_cache_{k}", 0) for k in kinds}}


def effective_config(trainer) -> dict:
    """Settings as the trainer resolved them (read back, not as asked: Unsloth changes some by itself)."""
    args = trainer.args
    model = trainer.model
    peft = getattr(model, "peft_config", {}).get("default")
    lora = None
    if peft is not None:
        lora = {"r": peft.r, "lora_alpha": peft.lora_alpha, "lora_dropout": peft.lora_dropout,
                "target_modules": sorted(peft.target_modules) if peft.target_modules else None}
    generation = getattr(trainer, "generation_config", None)
    return {
        # Every argument, not a chosen few: a setting a library changes by itself must show up
        "trainer": {key: value for key, value in args.to_dict().items() if key not in UNRECORDED_ARGS},
        "generation": generation.to_diff_dict() if generation is not None else None,
        "lora": lora,
        "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        # PEFT keeps adapters in float32 unless a library casts them: a difference in how the update is computed
        "trainable_dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad}),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "attn_implementation": getattr(getattr(model, "config", None), "_attn_implementation", None),
        "gradient_checkpointing": getattr(model, "is_gradient_checkpointing", None),
    }
