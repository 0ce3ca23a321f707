"""Unsloth's GRPO code takes a square output layer's hidden states for logits.

Unsloth's GRPO trainer asks the model's forward for its last hidden states (UNSLOTH_RETURN_HIDDEN_STATES=1) and
then decides whether what came back is hidden states or logits (`_unsloth_grpo_returns_hidden_states`,
unsloth/models/rl_replacements.py). The width decides where the vocabulary and the hidden size differ; where they
are equal a marker decides, and the marker is wrong: the wrapper Unsloth installs around the forward when the
trainer is built records a fallback to logits (`_unsloth_grpo_hidden_states_degraded`) although Unsloth's own
Qwen3 forward returned hidden states. The loss then takes log-softmax of hidden states for log-probabilities.

Two random tiny Qwen3 models (hidden size 128, 4 layers), one with 128 vocabulary rows (a square output layer) and
one with 256. For each: Unsloth's loader and LoRA, TRL's GRPOTrainer as Unsloth patches it, then, as the trainer's
log-probability code does, one forward with UNSLOTH_RETURN_HIDDEN_STATES=1 and Unsloth's own decision on its
output; the log-probabilities of the next tokens taken both ways against the model's real ones (a forward without
the flag). Then one real training step, counting every decision the loss makes.

    HF_HUB_OFFLINE=1 python reproduce.py      # a CUDA GPU; unsloth 2026.10.9, trl <= 1.15, transformers <= 5.17

Needs a GPU (Unsloth does not load without one); nothing of the workflow. Exits 1 while the square layer's hidden
states are taken for logits, 0 when both models' log-probabilities are read right, 2 when the run could not decide.
"""

import os
import string
import sys
import tempfile
from pathlib import Path

HIDDEN, LAYERS, SEED = 128, 4, 0
TEXT = "12+30=42\n7+8=15\n"


def build(folder: Path, rows: int) -> None:
    """A random Qwen3 with `rows` vocabulary rows and a character-level tokenizer, saved as a hub model is."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    tokens = ["<|pad|>", "<|endoftext|>", "<|unk|>", *[c for c in string.printable if c not in "\t\r\x0b\x0c"]]
    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|pad|>",
                                        unk_token="<|unk|>", padding_side="left")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    config = Qwen3Config(vocab_size=rows, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=HIDDEN // 4,
                         max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(SEED)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def probe(folder: Path, rows: int, scratch: Path) -> dict:
    from unsloth import FastLanguageModel  # before trl: Unsloth patches its GRPOTrainer on import

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = FastLanguageModel.from_pretrained(model_name=str(folder), max_seq_length=128,
                                                         dtype=torch.bfloat16, load_in_4bit=False, random_state=SEED)
    model = FastLanguageModel.get_peft_model(
        model, r=8, lora_alpha=16, lora_dropout=0.0, bias="none", use_gradient_checkpointing=False,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        random_state=SEED)
    args = GRPOConfig(output_dir=str(scratch / f"out{rows}"), max_steps=1, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=8, beta=0.04, learning_rate=1e-4, bf16=True,
                      logging_steps=1, report_to="none", use_vllm=False, seed=SEED, save_strategy="no")
    data = Dataset.from_list([{"prompt": f"{a}+{a}="} for a in range(8)])
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=data,
                          reward_funcs=[lambda completions, **_: [float(len(c) % 3) for c in completions]])
    module = sys.modules[type(trainer).__module__]
    decide = getattr(module, "_unsloth_grpo_returns_hidden_states", None)
    if decide is None:
        return {"rows": rows, "error": f"{module.__name__} has no _unsloth_grpo_returns_hidden_states"}
    head = model.get_output_embeddings().weight
    ids = tokenizer(TEXT, return_tensors="pt").input_ids.to(head.device)
    target = ids[0, 1:]

    def next_token_logps(scores):
        return torch.log_softmax(scores[0, :-1].float(), dim=-1).gather(-1, target[:, None])[:, 0]

    with torch.no_grad():
        os.environ["UNSLOTH_RETURN_HIDDEN_STATES"] = "0"
        real = next_token_logps(trainer.model(input_ids=ids).logits)  # the model's own log-probabilities
        os.environ["UNSLOTH_RETURN_HIDDEN_STATES"] = "1"  # as the trainer's log-probability code asks
        out = trainer.model(input_ids=ids).logits
        said_hidden = bool(decide(trainer.model, out, head))  # read right after the call, as the trainer does
        os.environ["UNSLOTH_RETURN_HIDDEN_STATES"] = "0"
        as_hidden = next_token_logps(out.float() @ head.float().T) if out.shape[-1] == head.shape[1] else None
        as_logits = next_token_logps(out) if out.shape[-1] == head.shape[0] else None
    median = (lambda x: None if x is None else float((x - real).abs().median()))
    is_hidden = as_hidden is not None and median(as_hidden) < 0.05
    read = as_hidden if said_hidden else as_logits

    decisions = []  # every decision of one real training step's loss: (said hidden, width of what it decided on)

    def counted(model_, tensor, lm_head, _decide=decide):
        answer = _decide(model_, tensor, lm_head)
        decisions.append((bool(answer), int(tensor.shape[-1])))
        return answer

    module._unsloth_grpo_returns_hidden_states = counted
    train_error = None
    try:
        trainer.train()
    except Exception as error:  # the decision above stands on its own; say why the step's count is missing
        train_error = f"{type(error).__name__}: {error}"
    finally:
        module._unsloth_grpo_returns_hidden_states = decide
    said_logits_on_hidden_width = sum(1 for hidden, width in decisions if not hidden and width == HIDDEN)
    return {
        "rows": rows, "head": tuple(head.shape), "forward_width": int(out.shape[-1]), "is_hidden": is_hidden,
        "said_hidden": said_hidden, "real": real[:8].tolist(), "read": None if read is None else read[:8].tolist(),
        "median_read_error": median(read), "median_as_hidden": median(as_hidden), "median_as_logits": median(as_logits),
        "training_decisions": len(decisions), "said_logits_at_hidden_width": said_logits_on_hidden_width,
        "train_error": train_error, "kl": next((log["kl"] for log in trainer.state.log_history if "kl" in log), None),
    }


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import importlib.metadata as meta

    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: Unsloth does not load without one", file=sys.stderr)
        return 2
    print("versions:", ", ".join(f"{p} {meta.version(p)}" for p in
                                 ("torch", "transformers", "trl", "peft", "unsloth", "unsloth_zoo")),
          "|", torch.cuda.get_device_name())
    defect, undecided = False, False
    with tempfile.TemporaryDirectory() as tmp:
        for rows in (2 * HIDDEN, HIDDEN):  # the control first: a defect must not hide a broken set-up
            folder = Path(tmp) / f"qwen3-{rows}"
            build(folder, rows)
            r = probe(folder, rows, Path(tmp))
            if "error" in r:
                print(f"\n{rows} rows: {r['error']}")
                undecided = True
                continue
            shape = "square" if rows == HIDDEN else "not square"
            print(f"\noutput layer {r['head'][0]} x {r['head'][1]} ({shape}); the forward under "
                  f"UNSLOTH_RETURN_HIDDEN_STATES=1 returned width {r['forward_width']}: "
                  f"{'hidden states' if r['is_hidden'] else 'not hidden states'} (through the output layer they give "
                  f"the model's log-probabilities within {r['median_as_hidden']})")
            print(f"  Unsloth decides: {'hidden states' if r['said_hidden'] else 'logits'}")
            print(f"  model's log-probabilities of the next tokens, first 8: {[round(v, 3) for v in r['real']]}")
            if r["read"] is not None:
                print(f"  what Unsloth's loss reads, first 8:            {[round(v, 3) for v in r['read']]}")
            print(f"  median |read - model|: {r['median_read_error']:.4f}")
            if r["train_error"]:
                print(f"  the training step failed: {r['train_error']}")
            print(f"  one training step: {r['training_decisions']} decisions, {r['said_logits_at_hidden_width']} "
                  f"of them 'logits' on a tensor of the hidden width; logged kl {r['kl']}")
            wrong = r["is_hidden"] and not r["said_hidden"]
            if rows != HIDDEN and wrong:
                print("  the control is read wrong too: not the square-layer defect")
                undecided = True
            defect |= rows == HIDDEN and wrong
    if undecided:
        print("\nundecided: see above")
        return 2
    print("\nDEFECT: the square output layer's hidden states are taken for logits" if defect
          else "\nboth layers' log-probabilities are read right")
    return 1 if defect else 0


if __name__ == "__main__":
    sys.exit(main())
