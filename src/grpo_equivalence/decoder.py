"""A plain PyTorch decoder for the rollout of Qwen3 and Llama models (backend `native`).

The policy's weights are read from the trainer's model with every LoRA adapter merged into a copy (the trainer's
weights are never changed), fused where a step reads them together (q, k and v; gate and up), and refreshed
whenever a trainable weight changed in place (an optimizer step, or a fault that swaps them for the rollout).
Prompts are left-padded as TRL pads them and get per-sequence positions as transformers' generate() gives
them; the KV cache is static, sized to prompt + completion. Sampling is transformers' own warpers, in
generate()'s order, on float32 logits, so the distribution is the one the study's settings define: the rollout
check judges it against `hf`.
"""

from dataclasses import dataclass

ARCHITECTURES = ("qwen3", "llama")
# Settings of a GenerationConfig that change sampling in ways this decoder does not implement, with the value
# that means "off"
UNSUPPORTED = {"repetition_penalty": 1.0, "top_h": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
               "no_repeat_ngram_size": 0, "bad_words_ids": None, "suppress_tokens": None,
               "begin_suppress_tokens": None, "min_new_tokens": None, "num_beams": 1, "encoder_repetition_penalty": 1.0}


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


def check_sampling(generation) -> None:
    problems = [f"{key}={value!r}" for key, off in UNSUPPORTED.items()
                if (value := getattr(generation, key, off)) is not None and value != off]
    if getattr(generation, "max_new_tokens", None) is None:
        problems.append("no max_new_tokens")
    if not getattr(generation, "do_sample", True):
        problems.append("do_sample=False")
    if problems:
        raise ValueError(f"backend 'native' samples with temperature, top_k, top_p and min_p only; this study's "
                         f"generation also sets {', '.join(problems)}: remove them, or use backend 'hf'")


def _weight(module):
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


class Decoder:
    """The merged weights of a causal LM, and a prefill and a decode step over a static KV cache."""

    def __init__(self, model):
        import torch

        self.lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        c = self.lm.config
        check_architecture(c)
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self._version = None
        self.torch = torch

    def version(self) -> tuple:
        return tuple(p._version for p in self.trainable) + tuple(p.data_ptr() for p in self.trainable)

    def refresh(self) -> bool:
        """Merges the weights again when a trainable one changed since the last merge; whether it did."""
        version = self.version()
        if version == self._version:
            return False
        torch = self.torch
        with torch.no_grad():
            inner = self.lm.model
            self.embed = inner.embed_tokens.weight.detach()
            self.norm = inner.norm.weight.detach()
            self.lm_head, self.lm_head_bias = _weight(self.lm.lm_head)
            self.layers = []
            for block in inner.layers:
                attn, mlp = block.self_attn, block.mlp
                (q, qb), (k, kb), (v, vb) = _weight(attn.q_proj), _weight(attn.k_proj), _weight(attn.v_proj)
                o, ob = _weight(attn.o_proj)
                (g, _), (u, _), (d, _) = _weight(mlp.gate_proj), _weight(mlp.up_proj), _weight(mlp.down_proj)
                biases = (qb, kb, vb)
                self.layers.append(Layer(
                    qkv=torch.cat([q, k, v]), qkv_bias=torch.cat(biases) if all(b is not None for b in biases) else None,
                    o=o, o_bias=ob, gate_up=torch.cat([g, u]), down=d,
                    input_norm=block.input_layernorm.weight.detach(), post_norm=block.post_attention_layernorm.weight.detach(),
                    q_norm=attn.q_norm.weight.detach() if hasattr(attn, "q_norm") else None,
                    k_norm=attn.k_norm.weight.detach() if hasattr(attn, "k_norm") else None))
        self._version = version
        return True

    def _rms(self, x, weight):
        torch = self.torch
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x.to(dtype)

    def rope_tables(self, length: int, device, dtype):
        """cos and sin for positions 0..length-1, from the model's own rotary embedding (its scaling included)."""
        torch = self.torch
        positions = torch.arange(length, device=device)[None]
        dummy = torch.zeros(1, length, self.head_dim, device=device, dtype=dtype)
        cos, sin = self.lm.model.rotary_emb(dummy, positions)
        return cos[0], sin[0]

    def forward(self, tokens, positions, cache, start: int, mask, rope):
        """Logits (float32) of the last position of `tokens` [B, T] at cache slots start..start+T-1. `mask` [B, T, L]:
        which cache slots each new position may attend to."""
        torch = self.torch
        F = torch.nn.functional
        cos, sin = rope[0][positions][:, None], rope[1][positions][:, None]  # [B, 1, T, hd]
        x = F.embedding(tokens, self.embed)
        b, t, _ = x.shape
        h, kvh, hd = self.heads, self.kv_heads, self.head_dim
        for layer, (keys, values) in zip(self.layers, cache, strict=True):
            residual = x
            y = self._rms(x, layer.input_norm)
            qkv = F.linear(y, layer.qkv, layer.qkv_bias)
            q, k, v = qkv.split([h * hd, kvh * hd, kvh * hd], dim=-1)
            q = q.view(b, t, h, hd)
            k = k.view(b, t, kvh, hd)
            if layer.q_norm is not None:
                q, k = self._rms(q, layer.q_norm), self._rms(k, layer.k_norm)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = v.view(b, t, kvh, hd).transpose(1, 2)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            keys[:, :, start:start + t] = k
            values[:, :, start:start + t] = v
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None], enable_gqa=kvh != h)
            x = residual + F.linear(y.transpose(1, 2).reshape(b, t, h * hd), layer.o, layer.o_bias)
            residual = x
            y = self._rms(x, layer.post_norm)
            gate, up = F.linear(y, layer.gate_up).chunk(2, dim=-1)
            x = residual + F.linear(F.silu(gate) * up, layer.down)
        x = self._rms(x[:, -1], self.norm)
        return F.linear(x, self.lm_head, self.lm_head_bias).to(torch.float32)

    def generate(self, prompts: list[list[int]], generation, eos_ids: list[int], pad_id: int, generator=None):
        """Completions of left-padded `prompts`, each up to and with its first EOS token, sampled as
        transformers' generate() samples with `generation` (temperature, top_k, top_p, min_p)."""
        torch = self.torch
        check_sampling(generation)
        self.refresh()
        device = self.embed.device
        dtype = self.embed.dtype
        b, p = len(prompts), max(len(x) for x in prompts)
        new = generation.max_new_tokens
        length = p + new
        tokens = torch.full((b, p), pad_id, dtype=torch.long, device=device)
        valid = torch.zeros((b, length), dtype=torch.bool, device=device)
        for i, prompt in enumerate(prompts):
            tokens[i, p - len(prompt):] = torch.tensor(prompt, device=device)
            valid[i, p - len(prompt):p] = True
        positions = (valid[:, :p].long().cumsum(-1) - 1).clamp(min=0)
        rope = self.rope_tables(length, device, dtype)
        cache = [(torch.zeros(b, self.kv_heads, length, self.head_dim, device=device, dtype=dtype),
                  torch.zeros(b, self.kv_heads, length, self.head_dim, device=device, dtype=dtype)) for _ in self.layers]
        causal = torch.ones(p, length, dtype=torch.bool, device=device).tril()
        # A padding position attends to itself only (its output is never used; a row with no key would be NaN)
        mask = (causal[None] & valid[:, None]) | torch.eye(p, length, dtype=torch.bool, device=device)[None]
        warpers = _warpers(generation)
        eos = torch.tensor(eos_ids, device=device)
        unfinished = torch.ones(b, dtype=torch.bool, device=device)
        out = torch.full((b, new), pad_id, dtype=torch.long, device=device)
        logits = self.forward(tokens, positions, cache, 0, mask, rope)
        position = positions[:, -1]
        for step in range(new):
            scores = logits
            for warp in warpers:
                scores = warp(None, scores)
            sampled = torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(1)
            sampled = torch.where(unfinished, sampled, torch.full_like(sampled, pad_id))
            out[:, step] = sampled
            unfinished &= ~torch.isin(sampled, eos)
            if not unfinished.any() or step == new - 1:
                break
            slot = p + step
            valid[:, slot] = True
            position = position + 1
            logits = self.forward(sampled[:, None], position[:, None], cache, slot, valid[:, None], rope)
        completions = []
        for row in out.tolist():
            ends = [i for i, token in enumerate(row) if token in eos_ids]
            completions.append(row[:ends[0] + 1] if ends else row)
        return completions


def _rotate_half(x):
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _warpers(generation) -> list:
    """transformers' own sampling warpers for `generation`, in generate()'s order."""
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    found = []
    if generation.temperature is not None and generation.temperature != 1.0:
        found.append(TemperatureLogitsWarper(generation.temperature))
    if generation.top_k is not None and generation.top_k != 0:
        found.append(TopKLogitsWarper(top_k=generation.top_k, min_tokens_to_keep=1))
    if generation.top_p is not None and generation.top_p < 1.0:
        found.append(TopPLogitsWarper(top_p=generation.top_p, min_tokens_to_keep=1))
    if generation.min_p is not None:
        found.append(MinPLogitsWarper(min_p=generation.min_p, min_tokens_to_keep=1))
    return found
