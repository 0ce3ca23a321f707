"""A model of a real architecture with random weights: for measuring speed and memory without downloading.

The shape comes from a published `config.json` (studies/architectures/); the weights are drawn with the
study's seed; the tokenizer is the tiny study's character-level one, filled up to the real vocabulary's size
so that embedding, softmax and sampling cost what they cost on the real model. Saved with `save_pretrained`
in the study's dtype and loaded by every backend with the same `from_pretrained` code as a checkpoint.
"""

import json
from pathlib import Path

from . import tiny
from .answer_format import CHAT_TEMPLATE


def load_architecture(path) -> dict:
    """The config.json of a real architecture: its fields, checked to describe a causal language model."""
    config = json.loads(Path(path).read_text())
    for key in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers"):
        if key not in config:
            raise ValueError(f"{path}: no {key!r}; give a model's config.json (e.g. studies/architectures/qwen3-4b.json)")
    return config


def model_config(architecture: dict, **overrides):
    """The transformers config of `architecture` (its shape; dtype and class names left to the caller)."""
    from transformers import AutoConfig

    fields = {k: v for k, v in architecture.items() if k not in ("model_type", "architectures", "torch_dtype", "dtype")}
    return AutoConfig.for_model(architecture["model_type"], **{**fields, **overrides})


def save(architecture: dict, out: Path, *, tokenizer_size: int, dtype: str, seed: int) -> int:
    """Builds the model and its tokenizer into `out`; returns the number of parameters."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = tiny.build_tokenizer(size=tokenizer_size)
    tokenizer.chat_template = CHAT_TEMPLATE
    config = model_config(architecture, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())
