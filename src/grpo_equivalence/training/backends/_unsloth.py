"""Unsloth's loader, shared by the two Unsloth backends (with and without vLLM)."""

from dataclasses import dataclass

from .base import UNSLOTH, Backend, Loaded, LoadSpec, torch_dtype

UNSLOTH_PACKAGES = (("transformers", "transformers"), ("peft", "peft"), ("trl", "trl<=1.15.0"),
                    ("unsloth", "unsloth"), ("unsloth_zoo", "unsloth_zoo"), ("bitsandbytes", "bitsandbytes"))


@dataclass(frozen=True)
class UnslothBackend(Backend):
    fast_inference: bool = False
    needs_cuda: bool = True
    stack: str = UNSLOTH

    def before_trl_import(self) -> None:
        import unsloth  # noqa: F401  (patches trl and transformers; must come before them)

    def load(self, spec: LoadSpec, **extra) -> Loaded:
        """`extra`: further from_pretrained arguments (the vLLM backend's gpu_memory_utilization)."""
        from unsloth import FastLanguageModel

        model, tokenizer = FastLanguageModel.from_pretrained(
            model_name=spec.model,
            max_seq_length=spec.max_seq_length,
            dtype=torch_dtype(spec.dtype),
            load_in_4bit=False,  # 16-bit LoRA, as the vanilla backends
            fast_inference=self.fast_inference,
            max_lora_rank=spec.lora["r"],
            random_state=spec.seed,
            **extra,
        )
        # The same rank, alpha, dropout and modules as the vanilla backends' LoraConfig. Unsloth wraps the
        # model itself (GRPOTrainer then gets no peft_config); its gradient checkpointing is its own
        # ("unsloth", offloaded), used when the study asks for checkpointing at all.
        model = FastLanguageModel.get_peft_model(
            model,
            r=spec.lora["r"],
            lora_alpha=spec.lora["lora_alpha"],
            lora_dropout=spec.lora["lora_dropout"],
            target_modules=list(spec.lora["target_modules"]),
            bias="none",
            use_gradient_checkpointing="unsloth" if spec.gradient_checkpointing else False,
            random_state=spec.seed,
        )
        return Loaded(model=model, tokenizer=tokenizer, peft_config=None)
