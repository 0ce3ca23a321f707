from dataclasses import dataclass

from .base import Backend


@dataclass(frozen=True)
class StaticCacheCompiled(Backend):
    """Plain generate() made fast where it is slow: transformers' eager decode launches hundreds of small kernels
    per token, so a step costs far more than reading the weights once. A static KV cache gives every decode step
    the same shapes, which lets transformers compile the step and replay it as a CUDA graph. On the CPU
    transformers does not compile, and this is the static cache alone (which must sample exactly like `hf`)."""

    def grpo_overrides(self, options: dict) -> dict:
        return {"cache_implementation": "static"}

    def prepare_trainer(self, trainer, spec) -> list[str]:
        generation = getattr(trainer, "generation_config", None)
        if generation is None:
            raise RuntimeError("backend 'hf_static' expects TRL's GRPOTrainer to hold a generation_config for "
                               "transformers' generate(); this TRL version has none: use trl 1.15 or 1.16")
        # TRL builds its GenerationConfig with disable_compile=True; the compiled decode step is this backend.
        generation.disable_compile = False
        # One cache size for every call (prompt lengths vary by step): a new size would re-allocate the cache
        # and recompile the decode step.
        generation.max_cache_len = spec.max_seq_length
        return ["generation.disable_compile", "generation.max_cache_len"]


BACKEND = StaticCacheCompiled(
    name="hf_static",
    summary="vanilla transformers + PEFT, generate() with a static KV cache and a compiled decode step (CUDA graphs)",
    data_parallel=True,
    sampler_logits="generate",
)
