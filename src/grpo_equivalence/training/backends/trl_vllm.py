from dataclasses import dataclass

from .. import vllm_kernel
from . import _vllm
from .base import Backend

# TRL's own default for vllm_gpu_memory_utilization
DEFAULT_FRACTION = 0.3


@dataclass(frozen=True)
class TRLColocatedVLLM(Backend):
    """What TRL users without Unsloth run: the model loaded by transformers, LoRA by PEFT, and TRL's own vLLM
    engine in the training process. TRL builds the engine from the model's path (`LLM(model=name_or_path)`, the
    checkpoint's dtype) and before each generation merges the LoRA adapter and loads the merged weights into it."""

    def before_trl_import(self) -> None:
        _vllm.prepare_process()
        _vllm.start_engines_quietly()

    def gpu_memory_share(self, options: dict) -> float:
        return _vllm.fraction(options, DEFAULT_FRACTION)

    def grpo_overrides(self, options: dict) -> dict:
        return _vllm.colocate_overrides(options, DEFAULT_FRACTION)

    def prepare_trainer(self, trainer, spec) -> list[str]:
        return vllm_kernel.exact_top_p(spec.options, self.name)


BACKEND = TRLColocatedVLLM(
    name="trl_vllm",
    summary="transformers + PEFT, TRL use_vllm=True, vllm_mode=colocate: TRL's own vLLM engine in the training process",
    packages=(("transformers", "transformers"), ("peft", "peft"), ("trl", "trl"), ("vllm", "vllm")),
    needs_cuda=True,
    options={**_vllm.OPTIONS, **vllm_kernel.EXACT_TOP_P},
    flags=tuple(vllm_kernel.EXACT_TOP_P),
    sampler_order="vllm",
    sampler_logits="vllm",
)
