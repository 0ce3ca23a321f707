"""Hand-made statistics files in the contract's shape, for testing what is derived from them."""

from grpo_equivalence.analysis import stats

# A rollout check of a few prompts, for the tests that exercise the workflow rather than the check itself
SMALL_ROLLOUT_CHECK = {"prompts": 8, "prompts_per_call": 8}


def make_stats(backend="hf", n=6, *, wall=None, loss=None, reward=None, kl=None, grad_norm=None, peak=1.0, seed=3407):
    steps = []
    for i in range(1, n + 1):
        steps.append({
            "step": i,
            "wall_s": wall(i) if wall else 1.0 + i / 10,
            "loss": loss(i) if loss else 0.1 * i,
            "grad_norm": grad_norm(i) if grad_norm else 0.5,
            "reward": reward(i) if reward else float(i),
            "kl": kl(i) if kl else 0.01 * i,
            "peak_mem_gb": peak + i / 100,
            "metrics": {"frac_reward_zero_std": 0.25, "entropy": 1.0, "completions/mean_length": 10.0},
        })
    return {
        "schema_version": stats.SCHEMA_VERSION, "backend": backend, "max_steps": n, "seed": seed, "model": "m",
        "dataset": "d", "train_wall_s": 10.0 * n, "peak_mem_gb": max(s["peak_mem_gb"] for s in steps), "steps": steps,
        "effective_config": {"trainer": {"beta": 0.001}, "lora": None, "generation": None},
        "environment": {"packages": {"trl": "1.16.0"}, "gpu_name": None, "gpu_count": 0, "git_commit": "abc"},
    }


def _cells(line: str) -> list[str]:
    # A cell may hold an escaped pipe (\|), which does not split it
    import re

    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def markdown_tables(text: str) -> list[dict]:
    """Every Markdown table of `text`: its header cells and its rows' cells, in order."""
    tables, lines = [], text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and lines[i + 1].startswith("| ---") and not (i and lines[i - 1].startswith("|")):
            rows = []
            for body in lines[i + 2:]:
                if not body.startswith("|"):
                    break
                rows.append(_cells(body))
            tables.append({"header": _cells(line), "rows": rows})
    return tables


def tables_headed(text: str, *first_cells: str) -> list[dict]:
    """The tables whose header starts with `first_cells`, as lists of {column: cell} rows."""
    found = []
    for table in markdown_tables(text):
        if table["header"][: len(first_cells)] == list(first_cells):
            found.append([dict(zip(table["header"], row, strict=True)) for row in table["rows"]])
    return found


# LoRA on all seven projections of a small Qwen3, for the adapters' own tests
ALL_SEVEN = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0,
             "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def small_qwen3_config():
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def shared_inputs_step(device: str, share: bool, autocast: bool = True):
    """One forward and backward pass of a bfloat16 Qwen3 under PEFT's LoRA (B drawn, not zero, so that every
    adapter's gradient flows) on `device`, its adapters sharing their input or not: the logits, the adapters'
    gradients and the bytes autograd kept."""
    import torch
    from peft import get_peft_model
    from transformers import Qwen3ForCausalLM

    from grpo_equivalence.training.backends.base import lora_config, share_adapter_inputs

    torch.manual_seed(1)
    model = get_peft_model(Qwen3ForCausalLM(small_qwen3_config()).to(torch.bfloat16), lora_config(ALL_SEVEN)).to(device)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.02)
    if share:
        assert share_adapter_inputs(model) == 14
    kept = {}

    def pack(tensor):
        kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids).logits
    logits.float().logsumexp(-1).mean().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}, sum(kept.values())


def assert_shared_inputs_exact(device: str) -> None:
    """Shared adapter inputs under autocast: the same logits and gradients bit for bit, fewer bytes kept."""
    import torch

    (own, own_grads, own_bytes), (shared, shared_grads, shared_bytes) = (shared_inputs_step(device, False),
                                                                         shared_inputs_step(device, True))
    assert torch.equal(own, shared) and len(own_grads) == 28
    assert all(torch.equal(own_grads[n], shared_grads[n]) for n in own_grads)
    assert shared_bytes < own_bytes
