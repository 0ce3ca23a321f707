"""One GRPO training run: a backend, a step count, and the study's settings; writes the statistics file."""

import contextlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import backends, environment, faults, gpus, memory, rewards, stats
from .answer_format import CHAT_TEMPLATE
from .data import load_problems
from .runwarnings import WarningLog

# Settings the workflow itself fixes for every run (not study choices, config.WORKFLOW_OWNED_GRPO says why): one
# log per optimizer step so that statistics align step by step, and no checkpoints (the statistics file is the
# run's output). TRL's own progress bar is off by default (a job's log shows the workflow's progress line instead).
FIXED_ARGS = {"logging_steps": 1, "logging_strategy": "steps", "save_strategy": "no"}
DEFAULT_ARGS = {"report_to": "none", "disable_tqdm": True}  # a study's grpo section may set these
# Trainer arguments left out of `effective_config`: paths that differ per run by construction.
UNRECORDED_ARGS = ("output_dir", "logging_dir", "run_name")


# Train on the CPU although GPUs were requested: for test clusters whose GPUs are dummies.
FORCE_CPU_ENV = "GRPO_EQUIVALENCE_TRAIN_DEVICE"


def device_for(gpus: int) -> str:
    """"cuda" when the job was given GPUs, "cpu" when given none; fails if GPUs were promised but absent."""
    import torch

    if gpus == 0 or os.environ.get(FORCE_CPU_ENV) == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"this train job asked for {gpus} GPU(s) (gpus_per_train_job) but no CUDA device is visible; "
            f"run it on a GPU node, or set gpus_per_train_job: 0 to train on the CPU"
        )
    return "cuda"


def check_runnable(config: dict, backend_names) -> None:
    """Raises if any of `backend_names` cannot train here with the config's GPU request (no model loaded)."""
    device = device_for(config["gpus_per_train_job"])
    problems = []
    for name in backend_names:
        try:
            backends.get(name).check_runnable(device)
        except backends.BackendUnavailable as error:
            problems.append(str(error))
    if problems:
        raise backends.BackendUnavailable("\n".join(problems))


def check_packages(backend_name: str, config: dict | None = None) -> None:
    """The backend's packages, checked without touching CUDA (before a GPU lease is taken), and the study's extra
    GRPOConfig fields against the TRL installed here (a planning machine without TRL could not check them)."""
    backends.get(backend_name).check_runnable(None)
    from .config import grpo_field_problems

    problems = grpo_field_problems((config or {}).get("grpo") or {})
    if problems:
        raise SystemExit("error: " + "; ".join(problems))


def seed_samplers(seed: int) -> None:
    """Every random number generator of this process from the run's seed, once the trainer is built: a vLLM engine
    runs in this process and seeds its generators when it starts (TRL's colocated engine with 0, whatever the
    run's seed), so without this every seed of a vLLM backend would sample from the same random stream."""
    from accelerate.utils import set_seed

    set_seed(seed, device_specific=True)  # as TRL seeds before generating


def use_chat_template(tokenizer, template: str | None) -> None:
    """The study's chat_template on the tokenizer: the model's own (None), the original study's ("study"), a
    Jinja template, or a file holding one."""
    if template == "study":
        tokenizer.chat_template = CHAT_TEMPLATE
    elif template:
        tokenizer.chat_template = Path(template).read_text() if "{" not in template else template
    elif not getattr(tokenizer, "chat_template", None):
        raise ValueError("the model's tokenizer has no chat template; set chat_template in the study (\"study\" for "
                         "the original study's, a Jinja template, or a file holding one)")


@dataclass
class Session:
    """A GRPOTrainer built for one backend as a train job builds it, with what the run records of its making."""
    trainer: object
    warned: WarningLog
    rollout_settings: list  # GRPOConfig keys and generation.<key> settings that select the backend's rollout
    startup_began: float


@contextlib.contextmanager
def session(config: dict, backend_name: str, max_steps: int, *, model_path: str, dataset: dict, callbacks=(),
            seed: int | None = None, tracking: dict | None = None, startup_began: float | None = None, log=print):
    """The backend's model and GRPOTrainer as training uses them (also for the rollout check, which samples
    through the same trainer without training). `seed` overrides the study's (a replicate's); `tracking`: the
    run's name and project for the trackers grpo.report_to names (tracked); `startup_began`: when the start-up
    began (perf_counter; by default here)."""
    backend = backends.get(backend_name)
    device = device_for(config["gpus_per_train_job"])
    backend.check_runnable(device)  # before anything is loaded: a missing package costs seconds, not a model load
    startup_began = startup_began or time.perf_counter()
    grpo = {**config["grpo"], **({} if seed is None else {"seed": seed})}
    # Every warning of loading and training is kept with the run: a setting a backend ignores shows here.
    with WarningLog() as warned, contextlib.ExitStack() as loading:
        backend.before_trl_import()
        from trl import GRPOConfig, GRPOTrainer

        options = (config.get("backend_options") or {}).get(faults.split(backend_name)[0], {})
        # Loading allocates on the GPU, which a vLLM engine starting beside it must not see (gpus.quiet); a vLLM
        # backend's engine takes the lock itself, for its start alone (its loading is mostly the engine's).
        if not backend.gpu_memory_share(options):
            loading.enter_context(gpus.quiet())
        spec = backends.LoadSpec(model=model_path, dtype=config["dtype"], lora=config["lora"],
                                 max_seq_length=config.get("max_seq_length", 2048), device=device, seed=grpo["seed"],
                                 gradient_checkpointing=grpo["gradient_checkpointing"], options=options)
        log(f"[{backend_name} x {max_steps}] loading {model_path} on {device}")
        loaded = backend.load(spec)
        tokenizer = loaded.tokenizer
        use_chat_template(tokenizer, config.get("chat_template"))
        problems = load_problems(dataset, system_prompt=config.get("system_prompt"), tokenizer=tokenizer)
        # No checkpoints are saved; the trainer's output_dir is a scratch folder, not a result.
        with tempfile.TemporaryDirectory(prefix=f"grpo_{backend_name}_{max_steps}_") as scratch:
            overrides = backend.grpo_overrides(options)
            args = GRPOConfig(
                output_dir=scratch,
                max_steps=max_steps,
                use_cpu=device == "cpu",
                bf16=config["dtype"] == "bfloat16" and device == "cuda",
                fp16=config["dtype"] == "float16" and device == "cuda",
                **{**DEFAULT_ARGS, **(tracking or {}), **grpo},
                **FIXED_ARGS,
                **overrides,
            )
            trainer = GRPOTrainer(
                model=loaded.model,
                processing_class=tokenizer,
                reward_funcs=rewards.load(config.get("rewards") or [rewards.STUDY_SET], tokenizer.eos_token),
                args=args,
                train_dataset=problems,
                peft_config=loaded.peft_config,
                callbacks=list(callbacks),
            )
            prepared = backend.prepare_trainer(trainer, spec)
            loading.close()  # loaded: the GPU may see others start again
            seed_samplers(grpo["seed"])
            yield Session(trainer=trainer, warned=warned,
                          rollout_settings=sorted(overrides) + sorted(prepared), startup_began=startup_began)


TRACKING = Path("results/tracking")  # what the trackers of grpo.report_to write, by study and run


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
    recorder = stats.make_recorder(probe, torch.cuda.synchronize if device == "cuda" else lambda: None,
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
        with stats.trl_profiling(recorder) if recorder_mode != "timestamps" else contextlib.nullcontext():
            trainer.train()
        train_wall = time.perf_counter() - start
        finished_at = time.time()
        # After training, so that it slows no step: against it a decode step's time is judged (summary)
        # Only on a GPU of its own: beside other jobs the figure is theirs too, and freeing its 2 GB could land in
        # a neighbour's vLLM start (gpus.quiet)
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
                       "sampler_seed": config["grpo"]["seed"], "fault": faults.split(backend_name)[1]}
        model_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
        if adapter is not None:  # the trained LoRA adapter and the tokenizer it was trained with (save_adapters)
            trainer.model.save_pretrained(adapter)
            trainer.processing_class.save_pretrained(adapter)

    steps = stats.step_records(recorder.records)
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
        "environment": {**environment.describe(), "gpu_lease": gpu_lease() if callable(gpu_lease) else gpu_lease,
                        "memory_bandwidth_gbs": bandwidth, "torch_compile": compiled,
                        # processes that trained the run together (data parallel, grpo_equivalence.parallel)
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
