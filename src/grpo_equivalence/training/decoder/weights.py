"""The policy's weights as the decoder reads them: every active LoRA adapter merged into a copy (the trainer's
weights are never changed), fused where a step reads them together (q, k and v; gate and up); or, unmerged, the
trainer's own tensors where they lie, each adapted layer as its base weight and its adapter (kernels.linear applies
it as PEFT does), with no copy of the model at all."""

from dataclasses import dataclass

ARCHITECTURES = ("qwen3", "llama")


class UnsupportedModel(ValueError):
    pass


def check_architecture(config) -> None:
    """Refuses, naming it, a model this decoder does not implement."""
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        raise UnsupportedModel(f"backend 'native' decodes {' and '.join(ARCHITECTURES)} models; this model is "
                               f"{kind!r} ({', '.join(getattr(config, 'architectures', None) or [])}): use backend "
                               f"'hf' or 'hf_static' for it")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"backend 'native' implements the SiLU MLP; this {kind} model uses "
                               f"{config.hidden_act!r}: use backend 'hf'")
    if getattr(config, "use_sliding_window", False):
        raise UnsupportedModel(f"backend 'native' has no sliding-window attention, which this {kind} model uses: "
                               f"use backend 'hf'")


def weight_of(module):
    """A linear layer's weight with its active, unmerged LoRA adapters added (a new tensor; PEFT's own delta)."""
    base = getattr(module, "base_layer", None)
    lora = base is not None and hasattr(module, "get_delta_weight")
    layer = base if lora else module
    weight, bias = layer.weight.detach(), getattr(layer, "bias", None)
    if lora and not getattr(module, "merged", False) and not getattr(module, "disable_adapters", False):
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                weight = weight + module.get_delta_weight(adapter).detach().to(weight.dtype)
    return weight, None if bias is None else bias.detach()


def unmerged_of(module) -> tuple:
    """A linear layer read where it lies, as (weight, bias, A, B, scaling) of the trainer's own tensors: for a LoRA
    layer with its adapter on, the base layer's and the adapter's (kernels.linear applies it as PEFT does), else
    its weight with A and B None."""
    base = getattr(module, "base_layer", None)
    layer = base if base is not None else module
    weight, bias = layer.weight.detach(), getattr(layer, "bias", None)
    bias = None if bias is None else bias.detach()
    if base is None or not hasattr(module, "get_delta_weight") or getattr(module, "merged", False) \
            or getattr(module, "disable_adapters", False):
        return weight, bias, None, None, 0.0
    adapters = [a for a in module.active_adapters if a in module.lora_A]
    if len(adapters) != 1 or getattr(module, "use_dora", {}).get(adapters[0], False):
        raise UnsupportedModel(f"backend 'native' reads unmerged adapters for one plain LoRA adapter a layer; this "
                               f"layer has {len(adapters)} active{' (DoRA)' if len(adapters) == 1 else ''}: turn "
                               f"unmerged_adapters off")
    adapter = adapters[0]
    return (weight, bias, module.lora_A[adapter].weight.detach(), module.lora_B[adapter].weight.detach(),
            float(module.scaling[adapter]))


def unmerged_layer(block) -> "Layer":
    """A decoder layer's weights read where they lie (unmerged_of): q, k and v, gate and up each apart, none fused
    (a fused weight is a copy); each linear carries its own bias."""
    attn, mlp = block.self_attn, block.mlp
    return Layer(qkv=tuple(unmerged_of(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj)), qkv_bias=None,
                 o=unmerged_of(attn.o_proj), o_bias=None,
                 gate_up=(unmerged_of(mlp.gate_proj), unmerged_of(mlp.up_proj)), down=unmerged_of(mlp.down_proj),
                 input_norm=block.input_layernorm.weight.detach(),
                 post_norm=block.post_attention_layernorm.weight.detach(),
                 q_norm=attn.q_norm.weight.detach() if hasattr(attn, "q_norm") else None,
                 k_norm=attn.k_norm.weight.detach() if hasattr(attn, "k_norm") else None)


@dataclass
class Layer:
    qkv: object
    qkv_bias: object
    o: object
    o_bias: object
    gate_up: object
    down: object
    input_norm: object
    post_norm: object
    q_norm: object  # Qwen3's per-head norms; None for Llama
    k_norm: object


def merged_layer(block) -> Layer:
    """A decoder layer's weights with the adapters merged, fused where a step reads them together."""
    import torch

    attn, mlp = block.self_attn, block.mlp
    (q, qb), (k, kb), (v, vb) = weight_of(attn.q_proj), weight_of(attn.k_proj), weight_of(attn.v_proj)
    o, ob = weight_of(attn.o_proj)
    (g, _), (u, _), (d, _) = weight_of(mlp.gate_proj), weight_of(mlp.up_proj), weight_of(mlp.down_proj)
    biases = (qb, kb, vb)
    return Layer(qkv=torch.cat([q, k, v]), qkv_bias=torch.cat(biases) if all(b is not None for b in biases) else None,
                 o=o, o_bias=ob, gate_up=torch.cat([g, u]), down=d, input_norm=block.input_layernorm.weight.detach(),
                 post_norm=block.post_attention_layernorm.weight.detach(),
                 q_norm=attn.q_norm.weight.detach() if hasattr(attn, "q_norm") else None,
                 k_norm=attn.k_norm.weight.detach() if hasattr(attn, "k_norm") else None)

