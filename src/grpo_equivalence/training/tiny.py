"""The built-in tiny study: a deterministic tiny Qwen3, a character-level tokenizer, and arithmetic problems.

Everything here is seeded and built on the CPU, so the same config gives the same model, tokenizer and
data set on every machine. The model is saved with `save_pretrained` and loaded back by the train rule
with the same `from_pretrained` code as a hub model.
"""

import json
import random
import string
from pathlib import Path

from .answer_format import CHAT_TEMPLATE, MARKERS

EOS, PAD, UNK = "<|endoftext|>", "<|pad|>", "<|unk|>"
# Printable ASCII and newline, one token each; the four markers are single tokens so that the format
# is cheap to learn for a model this small.
CHARACTERS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
# Real checkpoints pad their embedding beyond the tokenizer (Qwen3: 151,936 rows for 151,669 tokens) to a
# multiple that suits the kernels, and vLLM relies on it: Unsloth's load_vllm stops with "The size of tensor
# a (103) must match the size of tensor b (128)" on an unpadded 103-row embedding. The rows past the
# tokenizer are never a target; priming teaches the model not to sample them.
VOCAB_MULTIPLE = 128


def padded_vocab_size(tokens: int, hidden_size: int | None = None) -> int:
    """The embedding's rows: the tokenizer's size rounded up to VOCAB_MULTIPLE, and never the hidden size. An output
    layer as wide as it is tall (vocabulary = hidden size) is the one shape where Unsloth's GRPO code cannot tell the
    final hidden states its forward returns from logits by their width; Unsloth 2026.10.9 then takes them for logits,
    and its loss reads log-probabilities near log(1/rows) for the policy and the reference model alike
    (docs/examples/h200-non-square-head). Real checkpoints are far from square (Qwen3-4B: 151,936 by 2,560)."""
    rows = -(-tokens // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    return rows + VOCAB_MULTIPLE if rows == hidden_size else rows


def build_tokenizer(size: int | None = None):
    """The character-level tokenizer; with `size`, filled up to `size` tokens with tokens no text maps to
    (a real vocabulary's size, for a model of a real architecture: its embedding and softmax are full size)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = [PAD, EOS, UNK, *MARKERS, *CHARACTERS]
    if size is not None:
        if size < len(tokens):
            raise ValueError(f"a tokenizer of {size} tokens cannot hold the {len(tokens)} the study needs")
        tokens += [f"<|t{i}|>" for i in range(size - len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    # Markers are ordinary (not special) tokens: TRL decodes completions with skip_special_tokens=True,
    # which must keep them, as it keeps the plain-text markers of a real model's tokenizer.
    core.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer, *, hidden_size: int, num_layers: int, seed: int):
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=padded_vocab_size(len(tokenizer), hidden_size),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return model


def save_model(out_dir: Path, *, hidden_size: int, num_layers: int, seed: int) -> None:
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=hidden_size, num_layers=num_layers, seed=seed)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


COLUMNS = ("prompt", "solution", "working")  # DAPO-Math's, and the working out that priming teaches


def problems(n: int, max_operand: int, seed: int) -> list[dict]:
    """`n` sums `a+b` with operands in [0, max_operand], in DAPO-Math's columns (prompt, solution).

    Small operands on purpose: the tiny model learns some sums and not others, so check_answer varies
    within a group and GRPO has something to learn from.
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        rows.append(dict(zip(COLUMNS, (f"{a}+{b}", str(a + b), f"{a}+{b}={a + b}"), strict=True)))
    return rows


def save_problems(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
