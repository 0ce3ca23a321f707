from dataclasses import dataclass

from .base import Backend


@dataclass(frozen=True)
class Native(Backend):
    """TRL + PEFT training, rolled out by the project's own PyTorch decoder (grpo_equivalence.training.decoder): the
    policy's weights with the adapters merged into a copy, a static KV cache, transformers' sampling warpers; no
    vLLM. TRL's transformers generation path is replaced, nothing else of the trainer."""

    def prepare_trainer(self, trainer, spec) -> list[str]:
        from ..decoder.model import Decoder
        from ..decoder.sampling import check_sampling

        if getattr(trainer, "use_vllm", False) or getattr(trainer, "use_transformers_continuous_batching", False):
            raise RuntimeError("backend 'native' replaces TRL's transformers generation; this study turns on vLLM or "
                               "continuous batching in `grpo`: remove use_vllm / use_transformers_continuous_batching")
        generation = getattr(trainer, "generation_config", None)
        if generation is None or not hasattr(trainer, "eos_token_ids"):
            raise RuntimeError("backend 'native' expects TRL's GRPOTrainer to hold generation_config and "
                               "eos_token_ids; this TRL version has not: use trl 1.15 or 1.16")
        check_sampling(generation)  # before the first step: an unsupported setting fails at once
        unmerged = bool(spec.options.get(UNMERGED))
        native = Decoder(trainer.model, unmerged=unmerged)
        trainer.native_decoder = native  # the rollout check records what its sampler draws from
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)  # a processor holds one
        pad_id = tokenizer.pad_token_id

        def generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            import torch
            from trl.extras.profiling import profiling_context

            if images is not None and any(image is not None for image in images):
                raise RuntimeError("backend 'native' decodes text only; this study's prompts hold images")
            # timed as TRL times its own generation (summary.ROLLOUT_BLOCKS): the rollout's share of a step
            with torch.no_grad(), profiling_context(trainer, "native.generate"):
                completions = native.generate(prompt_ids, trainer.generation_config, trainer.eos_token_ids, pad_id)
            return completions, None

        trainer._generate_single_turn = generate_single_turn
        if native.graphs:  # compile and capture now, counted as start-up, not in the first step
            prompt = longest_prompt(trainer.train_dataset, tokenizer)
            if prompt:
                batch = trainer.args.generation_batch_size // trainer.accelerator.num_processes
                seconds = native.warm_up(prompt, batch, trainer.generation_config, trainer.eos_token_ids, pad_id)
                print(f"[native] decode step compiled and captured in {seconds:.1f} s (batch {batch}, prompts of up "
                      f"to {len(prompt)} tokens)", flush=True)
        return ["generation.native_decoder", *(["generation.native_decoder.unmerged_adapters"] if unmerged else [])]


def longest_prompt(dataset, tokenizer, rows: int = 2000) -> list[int]:
    """The token ids of the longest prompt among the first `rows` of the data set, as TRL tokenizes a prompt
    (a conversation through the chat template, with the generation prompt); none without a prompt column."""
    if dataset is None or "prompt" not in getattr(dataset, "column_names", []):
        return []
    longest: list[int] = []
    for row in dataset.select(range(min(rows, len(dataset)))):
        prompt = row["prompt"]
        if isinstance(prompt, str):
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        longest = ids if len(ids) > len(longest) else longest
    return list(longest)


UNMERGED = "unmerged_adapters"
BACKEND = Native(
    name="native",
    summary="TRL + PEFT, rollout by the project's PyTorch decoder (merged adapters, static KV cache), no vLLM",
    data_parallel=True,
    sampler_logits="native",
    options={UNMERGED: "true: the decode step reads the trainer's weights and LoRA adapters where they lie and adds "
                       "each adapter as PEFT does (the trainer's own logits; no merged copy: the adapted weights' "
                       "memory, 7.3 GB at the Qwen3-4B shape, at the cost of the adapters' small products each "
                       "step); false (the default): a merged copy"},
    flags=(UNMERGED,),
)
