"""A GRPOTrainer built for one backend as a train job builds it: the device, the backend's model and settings, the
study's data, rewards and chat template. Training (train), the rollout check and the trainer check use it alike."""

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..runtime import quietlock
from . import backends, faults, rewards
from .answer_format import CHAT_TEMPLATE
from .data import load_problems
from .runwarnings import WarningLog

# Settings the workflow itself fixes for every run (not study choices, grpo_fields.WORKFLOW_OWNED_GRPO says why): one
# log per optimizer step so that statistics align step by step, and no checkpoints (the statistics file is the
# run's output). TRL's own progress bar is off by default (a job's log shows the workflow's progress line instead).
FIXED_ARGS = {"logging_steps": 1, "logging_strategy": "steps", "save_strategy": "no"}
DEFAULT_ARGS = {"report_to": "none", "disable_tqdm": True}  # a study's grpo section may set these


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
    """Raises if any of `backend_names` cannot train here with the config's GPU request (no model loaded), or a
    tracker or another setting the config names lacks its package."""
    from . import trackers
    from .grpo_fields import package_problems

    device = device_for(config["gpus_per_train_job"])
    problems = trackers.problems(config)
    for name in backend_names:
        problems += [p for p in package_problems(config, name) if p not in problems]
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
    from . import trackers
    from .grpo_fields import grpo_field_problems, package_problems

    config = config or {}
    problems = (grpo_field_problems(faults.grpo_settings(backend_name, config.get("grpo") or {}))
                + trackers.problems(config) + package_problems(config, backend_name))
    if problems:
        raise SystemExit("error: " + "; ".join(problems))


def seed_samplers(seed: int) -> None:
    """Every random number generator of this process from the run's seed, once the trainer is built: a vLLM engine
    runs in this process and seeds its generators when it starts (TRL's colocated engine with 0, whatever the
    run's seed), so without this every seed of a vLLM backend would sample from the same random stream."""
    from accelerate.utils import set_seed

    set_seed(seed, device_specific=True)  # as TRL seeds before generating


def apply_liger_kernels(trainer) -> None:
    """Liger's kernels on the trainer's model now, as transformers' Trainer.train() applies them at its start (the
    same call): the rollout and trainer checks never call train(), and must sample and compute with the kernels that
    training uses. The call patches modules in place, so train()'s own second call changes nothing."""
    from transformers.integrations.liger import apply_liger_kernel

    apply_liger_kernel(trainer.model, trainer.args.liger_kernel_config)


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
    backend: str  # the name it was built for (BACKEND, BACKEND+FAULT or BACKEND+CONFIGURATION)
    warned: WarningLog
    rollout_settings: list  # GRPOConfig keys and generation.<key> settings that select the backend's rollout
    startup_began: float
    loading_warnings: frozenset = frozenset()  # the warnings' keys (WarningLog.counts) when it was built


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
    grpo = {**faults.grpo_settings(backend_name, config["grpo"]), **({} if seed is None else {"seed": seed})}
    # Every warning of loading and training is kept with the run: a setting a backend ignores shows here.
    with WarningLog() as warned, contextlib.ExitStack() as loading:
        backend.before_trl_import()
        from trl import GRPOConfig, GRPOTrainer

        configuration = faults.CONFIGURATIONS.get(faults.configuration_of(backend_name), {})
        options = {**(config.get("backend_options") or {}).get(faults.split(backend_name)[0], {}),
                   **configuration.get("options", {})}
        # Loading allocates on the GPU, which a vLLM engine starting beside it must not see (quietlock.quiet); a vLLM
        # backend's engine takes the lock itself, for its start alone (its loading is mostly the engine's).
        if not backend.gpu_memory_share(options):
            loading.enter_context(quietlock.quiet())
        spec = backends.LoadSpec(model=model_path, dtype=config["dtype"], lora=config["lora"],
                                 max_seq_length=config.get("max_seq_length", 2048), device=device, seed=grpo["seed"],
                                 gradient_checkpointing=grpo["gradient_checkpointing"], options=options)
        log(f"[{backend_name} x {max_steps}] loading {model_path} on {device}")
        loaded = backend.load(spec)
        tokenizer = loaded.tokenizer
        use_chat_template(tokenizer, config.get("chat_template"))
        problems = load_problems(dataset, system_prompt=config.get("system_prompt"), tokenizer=tokenizer)
        reward_funcs = rewards.load(config.get("rewards") or [rewards.STUDY_SET], tokenizer.eos_token)
        if missing := rewards.missing_columns(reward_funcs, problems.column_names):  # a hub data set's, known now
            raise ValueError("; ".join(missing))
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
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=problems,
                peft_config=loaded.peft_config,
                callbacks=list(callbacks),
            )
            prepared = backend.prepare_trainer(trainer, spec)
            if trainer.args.use_liger_kernel:
                apply_liger_kernels(trainer)
            if configuration.get("shared_inputs"):
                from .backends.base import share_adapter_inputs

                shared = share_adapter_inputs(trainer.model)
                log(f"[{backend_name} x {max_steps}] {shared} LoRA layers hand their adapters the model's input as it is")
            loading.close()  # loaded: the GPU may see others start again
            seed_samplers(grpo["seed"])
            yield Session(trainer=trainer, backend=backend_name, warned=warned,
                          rollout_settings=sorted(overrides) + sorted(prepared), startup_began=startup_began,
                          loading_warnings=frozenset(warned.counts))

