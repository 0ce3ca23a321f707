"""What every rollout backend provides: a check that it can run here, a loader, and its GRPO settings.

A backend changes only how completions are generated (and, for Unsloth, how the model is patched);
every other GRPO setting comes from the config, identically for all backends.
"""

import importlib.util
from dataclasses import dataclass, field
from typing import Any

TRL_PEFT, UNSLOTH = "TRL + PEFT", "Unsloth"
# Per trainer stack, the backend whose rollout is the stack's plainest: a candidate is also judged against it,
# so that a difference of stacks is not read as a difference of rollouts
STACK_REFERENCES = {TRL_PEFT: "hf", UNSLOTH: "unsloth_fi_false"}


class BackendUnavailable(RuntimeError):
    """The backend cannot run where this job runs; raised before any model is loaded."""


@dataclass(frozen=True)
class LoadSpec:
    model: str  # hub id or local path
    dtype: str  # torch dtype name
    lora: dict  # r, lora_alpha, lora_dropout, target_modules
    max_seq_length: int
    device: str  # "cuda" or "cpu"
    seed: int
    gradient_checkpointing: bool
    options: dict = field(default_factory=dict)  # this backend's entry of backend_options


@dataclass
class Loaded:
    model: Any
    tokenizer: Any
    peft_config: Any = None  # given to GRPOTrainer when the loader did not wrap the model itself


@dataclass(frozen=True)
class Backend:
    name: str
    summary: str
    # (importable module, pip requirement) pairs that must be present where the job runs
    packages: tuple[tuple[str, str], ...] = (("transformers", "transformers"), ("peft", "peft"), ("trl", "trl"))
    needs_cuda: bool = False
    options: dict[str, str] = field(default_factory=dict)  # option name -> help
    flags: tuple[str, ...] = ()  # the options that are true or false
    # The trainer the backend trains through: a difference between stacks is not a rollout difference, so
    # each candidate is also judged against the reference of its own stack (STACK_REFERENCES)
    stack: str = TRL_PEFT
    # Whether a run can train on several processes at once (gpus_per_train_job > 1: grpo_equivalence.training.parallel);
    # a backend says so once a run of it has trained that way
    data_parallel: bool = False
    # The order the backend's sampler applies top_k, top_p and min_p in (scoring.ORDERS): vLLM takes min_p first,
    # transformers last; where top_p binds, the two keep different tokens from the same settings
    sampler_order: str = "transformers"
    # How the backend reports the logits its sampler drew each token from (training.sampler_logits: "generate",
    # "native", "vllm"); None: it cannot, and the rollout check scores its tokens with the trainer's logits only
    sampler_logits: str | None = None
    # The precisions the backend's engine cannot load in (Unsloth's vLLM refuses float32), and the backend of the same
    # trainer stack without that engine: a trainer check never samples, so where its precision is one of these (the
    # reference's control, in the other precision) it is built as that backend (trainer_check_backend)
    engine_refuses: tuple[str, ...] = ()
    without_engine: str | None = None

    def check_runnable(self, device: str | None) -> None:
        """Raises BackendUnavailable naming what is missing and how to fix it (device None: packages only)."""
        missing = [req for module, req in self.packages if importlib.util.find_spec(module) is None]
        problems = []
        if missing:
            problems.append(f"missing package(s) {', '.join(missing)} (install with: pip install {' '.join(missing)}, "
                            f"or pip install -e .[gpu] for the whole GPU stack)")
        if self.needs_cuda and device not in ("cuda", None):
            problems.append("it needs a CUDA GPU and this job has none (run it on a GPU node with gpus_per_train_job >= 1)")
        if problems:
            raise BackendUnavailable(
                f"backend {self.name!r} cannot run here: {'; '.join(problems)}. "
                f"Or drop {self.name!r} from `backends` in the config."
            )

    def gpu_memory_share(self, options: dict) -> float:
        """The fraction of a GPU's memory the backend reserves up front (vLLM's gpu_memory_utilization), beside what
        its runs measure: what a job sharing a GPU must find free (grpo_equivalence.study.gpushare)."""
        return 0.0

    def before_trl_import(self) -> None:
        """Runs before trl is imported (Unsloth must patch trl and transformers first)."""

    def load(self, spec: LoadSpec) -> Loaded:
        return load_with_transformers(spec)

    def grpo_overrides(self, options: dict) -> dict:
        """GRPOConfig settings that select this backend's rollout path (nothing else)."""
        return {}

    def prepare_trainer(self, trainer, spec: LoadSpec) -> list[str]:
        """Runs once the GRPOTrainer exists, before training: for rollout settings GRPOConfig cannot express.
        Returns the settings it changed, as the report names them ("generation.<key>"): rollout settings."""
        return []


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def lora_config(lora: dict):
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", bias="none", **lora)


def load_with_transformers(spec: LoadSpec) -> Loaded:
    """Vanilla transformers + PEFT: the model as users load it; TRL applies the LoRA adapter."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(spec.model, dtype=torch_dtype(spec.dtype))
    tokenizer = AutoTokenizer.from_pretrained(spec.model)
    return Loaded(model=model, tokenizer=tokenizer, peft_config=lora_config(spec.lora))


def share_adapter_inputs(model) -> int:
    """Every LoRA layer of `model` hands its input to its adapters as it is, where autocast would cast it to that dtype
    anyway, instead of PEFT's float32 copy per adapter (which autocast casts back, keeping a copy per adapter for the
    backward pass): bfloat16 -> float32 -> bfloat16 is exact, so the step's numbers are the same, and the adapters
    of one input (q, k and v; gate and up) keep one saved input between them. Without autocast (the CPU's trainer)
    PEFT casts as before. Needs lora_dropout 0 (dropout in float32 then rounded is not dropout in bfloat16). Returns
    the layers changed."""
    import types

    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer

    def cast(self, x, dtype):
        if x is not None and torch.is_autocast_enabled(x.device.type) \
                and x.dtype == torch.get_autocast_dtype(x.device.type):
            return x
        return type(self)._cast_input_dtype(self, x, dtype)

    changed = 0
    for module in model.modules():
        if isinstance(module, BaseTunerLayer) and hasattr(module, "lora_A"):
            if any(not isinstance(d, torch.nn.Identity) for d in getattr(module, "lora_dropout", {}).values()):
                raise ValueError("shared adapter inputs need lora.lora_dropout: 0.0 (dropout in float32 and rounded "
                                 "is not dropout in bfloat16); set it, or use a configuration without shared inputs")
            module._cast_input_dtype = types.MethodType(cast, module)
            changed += 1
    return changed


class WithFault:
    """A backend with one fault injected once its trainer exists (grpo_equivalence.training.faults); otherwise the same."""

    def __init__(self, backend: Backend, fault: str):
        self._backend, self.fault = backend, fault
        self.name = f"{backend.name}+{fault}"

    def __getattr__(self, attribute):
        return getattr(self._backend, attribute)

    def prepare_trainer(self, trainer, spec: LoadSpec) -> list[str]:
        from .. import faults

        return self._backend.prepare_trainer(trainer, spec) + faults.inject(trainer, self.fault)
