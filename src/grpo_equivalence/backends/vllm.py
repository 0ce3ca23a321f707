from ._unsloth import UNSLOTH_PACKAGES, UnslothBackend


class UnslothVLLM(UnslothBackend):
    def grpo_overrides(self, options: dict) -> dict:
        # Unsloth sets these itself when the model carries a vLLM engine; set explicitly so the
        # resolved settings say so whatever Unsloth's version does.
        return {"use_vllm": True, "vllm_mode": "colocate",
                "vllm_gpu_memory_utilization": options.get("gpu_memory_utilization", 0.5)}


BACKEND = UnslothVLLM(
    name="vllm",
    summary="Unsloth FastLanguageModel, fast_inference=True: vLLM colocated in the training process",
    packages=(*UNSLOTH_PACKAGES, ("vllm", "vllm")),
    fast_inference=True,
    options={"gpu_memory_utilization": "fraction of GPU memory vLLM reserves up front (Unsloth's gpu_memory_utilization)"},
)
