"""Priming: a short supervised pass so that the tiny model emits the answer format.

A randomly initialised model never writes `<SOLUTION>`, so every reward in a group is equal and GRPO has
no signal (`frac_reward_zero_std` = 1). A few dozen SFT steps on completions in the exact format fix that
while leaving the sums only partly learnt, which is what the comparison needs: rewards that vary.
"""

import json
import random
from pathlib import Path

from .answer_format import conversation, target_completion

# The primed weights depend on how many threads sum the gradients (a sum's order): priming always uses this many,
# whatever --cores lets the job have, so that every machine's workflow primes the same tiny model as far as its CPU
# kernels allow (measured: one thread primed other weights than two)
THREADS = 2


def encode(tokenizer, row: dict, system_prompt: str) -> tuple[list[int], int]:
    """Token ids of prompt + target completion + EOS, and where the completion starts."""
    prompt = tokenizer.apply_chat_template(conversation(row["prompt"], system_prompt), add_generation_prompt=True, tokenize=False)
    completion = target_completion(row["working"], row["solution"]) + tokenizer.eos_token
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return prompt_ids + tokenizer(completion, add_special_tokens=False)["input_ids"], len(prompt_ids)


def prime(model, tokenizer, rows: list[dict], *, system_prompt: str, steps: int, batch_size: int,
          learning_rate: float, seed: int, log=print) -> list[float]:
    """Trains `model` in place on `rows` (loss on completion tokens only); returns the loss of each step."""
    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    examples = [encode(tokenizer, row, system_prompt) for row in rows]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    losses = []
    for step in range(1, steps + 1):
        batch = rng.sample(examples, min(batch_size, len(examples)))
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (ids, start) in enumerate(batch):  # right padding: positions stay those of generation
            input_ids[i, : len(ids)] = torch.tensor(ids)
            labels[i, start : len(ids)] = torch.tensor(ids[start:])
            attention[i, : len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step % 20 == 0 or step == steps:
            log(f"prime step {step}/{steps}: loss {loss.item():.4f}")
    model.eval()
    return losses


def prime_saved(model_dir, data_file, out, *, system_prompt: str, dtype: str, steps: int, batch_size: int,
                learning_rate: float, seed: int) -> None:
    """Primes the model saved in `model_dir` on the problems of `data_file` (with THREADS threads) and saves it to
    `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(THREADS)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in Path(data_file).read_text().splitlines()]
    prime(model, tokenizer, rows, system_prompt=system_prompt, steps=steps, batch_size=batch_size,
          learning_rate=learning_rate, seed=seed)
    # Saved in the study's dtype, as a real checkpoint is: an engine that loads the model from its path
    # (TRL's vLLM takes the checkpoint's dtype) then runs in the dtype the trainer trains in.
    model.to(getattr(torch, dtype)).save_pretrained(out)
    tokenizer.save_pretrained(out)
