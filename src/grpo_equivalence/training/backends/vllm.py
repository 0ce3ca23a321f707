from . import _vllm
from ._unsloth import UNSLOTH_PACKAGES, UnslothBackend

# Unsloth's own default for gpu_memory_utilization
DEFAULT_FRACTION = 0.5


class UnslothVLLM(UnslothBackend):
    def before_trl_import(self) -> None:
        _vllm.prepare_process()
        super().before_trl_import()
        _vllm.start_engines_quietly()  # after Unsloth, which must be imported before vLLM imports transformers

    def gpu_memory_share(self, options: dict) -> float:
        return _vllm.fraction(options, DEFAULT_FRACTION)

    def load(self, spec):
        with _vllm.sized_from_total_memory():  # the engine's settings must not depend on the GPU's neighbours
            return super().load(spec, gpu_memory_utilization=_vllm.fraction(spec.options, DEFAULT_FRACTION))

    def grpo_overrides(self, options: dict) -> dict:
        # Unsloth sets these itself when the model carries a vLLM engine; set explicitly so the
        # resolved settings say so whatever Unsloth's version does.
        return _vllm.colocate_overrides(options, DEFAULT_FRACTION)


BACKEND = UnslothVLLM(
    name="vllm",
    summary="Unsloth FastLanguageModel, fast_inference=True: vLLM colocated in the training process",
    packages=(*UNSLOTH_PACKAGES, ("vllm", "vllm")),
    fast_inference=True,
    options=_vllm.OPTIONS,
    sampler_order="vllm",
    engine_refuses=("float32",),  # "Unsloth: We do not support dtype = torch.float32 yet!" (unsloth_zoo load_vllm)
    without_engine="unsloth_fi_false",
)
