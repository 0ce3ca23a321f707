from ._unsloth import UNSLOTH_PACKAGES, UnslothBackend


class UnslothHF(UnslothBackend):
    def grpo_overrides(self, options: dict) -> dict:
        return {"use_vllm": False}


BACKEND = UnslothHF(
    name="unsloth_fi_false",
    summary="Unsloth FastLanguageModel, fast_inference=False: generate() through Unsloth's patched model",
    packages=UNSLOTH_PACKAGES,
    fast_inference=False,
)
