"""A plain PyTorch decoder for the rollout of Qwen3 and Llama models (backend `native`).

The policy's weights are read from the trainer's model with every LoRA adapter merged into a copy (the trainer's
weights are never changed), fused where a step reads them together (q, k and v; gate and up), and refreshed
whenever a trainable weight changed in place (an optimizer step, or a fault that swaps them for the rollout).
Prompts are left-padded as TRL pads them and get per-sequence positions as transformers' generate() gives
them; the KV cache is static, sized to prompt + completion. Sampling is transformers' own warpers, in
generate()'s order, on float32 logits, so the distribution is the one the study's settings define: the rollout
check judges it against `hf`.

On a GPU the decode step is compiled and replayed as CUDA graphs: the projections and norms of a layer are one
compiled function and its attention and MLP another, each compiled once for every layer, the attention for any
length of cache. The cache writes, the attention mask and the sampling run between them as plain kernels, and a
graph holds them all, so a step costs no Python. There is one KV cache per batch size (grown when a longer prompt
comes) and one graph per attention window: a step attends over the first WINDOW-multiple of cache slots that
holds every token so far, not over the whole cache. On the CPU every step is eager.
Sampling draws among the top_k + TIES largest logits (the tokens top_k keeps, and ties with the k-th) with
transformers' own warpers, which is the distribution of the warpers over the whole vocabulary; without top_k it
uses the whole vocabulary.
"""

import time
from dataclasses import dataclass, fields

ARCHITECTURES = ("qwen3", "llama")
# Settings of a GenerationConfig that change sampling in ways this decoder does not implement, with the value
# that means "off"
UNSUPPORTED = {"repetition_penalty": 1.0, "top_h": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
               "no_repeat_ngram_size": 0, "bad_words_ids": None, "suppress_tokens": None,
               "begin_suppress_tokens": None, "min_new_tokens": None, "num_beams": 1, "encoder_repetition_penalty": 1.0}


WINDOW = 64  # cache slots a decode step's attention window grows by (one CUDA graph per window)
TIES = 16  # logits beyond top_k drawn among, so that ties with the k-th are kept as transformers keeps them
STATES = 2  # KV caches (with their graphs) kept at once, one per batch size and sampling; a third drops the oldest
CHECK_EVERY = 16  # decode steps between two looks at whether every sequence has ended (a look waits for the GPU)


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


def _merged_layer(block) -> Layer:
    """A decoder layer's weights with the adapters merged, fused where a step reads them together."""
    import torch

    attn, mlp = block.self_attn, block.mlp
    (q, qb), (k, kb), (v, vb) = _weight(attn.q_proj), _weight(attn.k_proj), _weight(attn.v_proj)
    o, ob = _weight(attn.o_proj)
    (g, _), (u, _), (d, _) = _weight(mlp.gate_proj), _weight(mlp.up_proj), _weight(mlp.down_proj)
    biases = (qb, kb, vb)
    return Layer(qkv=torch.cat([q, k, v]), qkv_bias=torch.cat(biases) if all(b is not None for b in biases) else None,
                 o=o, o_bias=ob, gate_up=torch.cat([g, u]), down=d, input_norm=block.input_layernorm.weight.detach(),
                 post_norm=block.post_attention_layernorm.weight.detach(),
                 q_norm=attn.q_norm.weight.detach() if hasattr(attn, "q_norm") else None,
                 k_norm=attn.k_norm.weight.detach() if hasattr(attn, "k_norm") else None)


class Decoder:
    """The merged weights of a causal LM, and a prefill and a decode step over a static KV cache. `compiled`: the
    decode step compiled and replayed as CUDA graphs (None: on a GPU)."""

    def __init__(self, model, compiled: bool | None = None):
        import torch

        self.lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        c = self.lm.config
        check_architecture(c)
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self._version = None
        self.layers = None
        self.torch = torch
        device = next(model.parameters()).device
        self.compiled = device.type == "cuda" if compiled is None else compiled
        self.graphs = device.type == "cuda" and self.compiled
        self._states: dict = {}  # (batch, cache length) -> _State, oldest first
        self._project = self._attend = None

    def version(self) -> tuple:
        return tuple(p._version for p in self.trainable) + tuple(p.data_ptr() for p in self.trainable)

    def refresh(self) -> bool:
        """Merges the weights again when a trainable one changed since the last merge; whether it did. A new merge
        is written, one layer at a time, into the tensors of the first one (the decode graphs hold their
        addresses): it never holds a second merged copy of the model, which would be the run's peak memory."""
        version = self.version()
        if version == self._version:
            return False
        with self.torch.no_grad():
            inner = self.lm.model
            self.embed = inner.embed_tokens.weight.detach()
            self.norm = inner.norm.weight.detach()
            if self.layers is None:
                self.layers = [_merged_layer(block) for block in inner.layers]
                self.lm_head, self.lm_head_bias = _weight(self.lm.lm_head)
            else:
                owned = {p.data_ptr() for p in self.lm.parameters()}
                for held, block in zip(self.layers, inner.layers, strict=True):
                    fresh = _merged_layer(block)  # one layer's merge at a time
                    for f in fields(Layer):
                        setattr(held, f.name, self._into(getattr(held, f.name), getattr(fresh, f.name), owned))
                    del fresh  # freed before the next layer's merge
                head = _weight(self.lm.lm_head)
                self.lm_head, self.lm_head_bias = (self._into(self.lm_head, head[0], owned),
                                                   self._into(self.lm_head_bias, head[1], owned))
        self._version = version
        return True

    def _into(self, held, value, owned: set):
        """`value` written into `held`, the tensor the graphs read, and `held` returned; a tensor of the trainer's
        own (a weight without adapters, read where it lies) is never written: where it now needs a merged copy
        (an adapter turned on), the copy takes its place and the graphs are captured again."""
        if held is None or value is None or held.data_ptr() == value.data_ptr():
            return value
        if held.data_ptr() in owned:
            self._states.clear()
            return value
        held.copy_(value)
        return held

    def _rms(self, x, weight):
        return _rms(x, weight, self.eps)

    def rope_tables(self, length: int, device, dtype):
        """cos and sin for positions 0..length-1, from the model's own rotary embedding (its scaling included)."""
        torch = self.torch
        positions = torch.arange(length, device=device)[None]
        dummy = torch.zeros(1, length, self.head_dim, device=device, dtype=dtype)
        cos, sin = self.lm.model.rotary_emb(dummy, positions)
        return cos[0], sin[0]

    def forward(self, tokens, positions, cache, start: int, mask, rope):
        """Logits (float32) of the last position of `tokens` [B, T] at cache slots start..start+T-1. `mask` [B, T, L]:
        which cache slots each new position may attend to. The prefill (eager, any length)."""
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
        return self._logits(x[:, -1])

    def _logits(self, x):
        F = self.torch.nn.functional
        return F.linear(self._rms(x, self.norm), self.lm_head, self.lm_head_bias).to(self.torch.float32)

    def _kernels(self):
        """The two halves of a decode layer, compiled when the decoder is (one compilation serves every layer)."""
        if self._project is None:
            if self.compiled:
                compile = lambda f: self.torch.compile(f, fullgraph=True)  # noqa: E731
                self._project, self._attend = compile(_project), compile(_attend)
            else:
                self._project, self._attend = _project, _attend
        return self._project, self._attend

    def _decode(self, s: "_State", window: int) -> None:
        """One decode step on the static buffers of `s`: the token of each sequence at its position into cache slot
        `s.slot` (below `window`), attending over the first `window` slots, then the next token sampled into
        `s.token` (padding once a sequence ended)."""
        torch = self.torch
        project, attend = self._kernels()
        s.valid.index_fill_(1, s.slot, True)
        valid = s.valid[:, :window]
        cos, sin = s.rope[0][s.position][:, None, None], s.rope[1][s.position][:, None, None]  # [B, 1, 1, hd]
        x = torch.nn.functional.embedding(s.token[:, None], self.embed)
        shape = (self.heads, self.kv_heads, self.head_dim, self.eps)
        for layer, (keys, values) in zip(self.layers, s.cache, strict=True):
            q, k, v = project(x, layer.input_norm, layer.qkv, layer.qkv_bias, layer.q_norm, layer.k_norm, cos, sin,
                              shape)
            keys.index_copy_(2, s.slot, k)
            values.index_copy_(2, s.slot, v)
            seen = (keys[:, :, :window], values[:, :, :window])
            if self.compiled:  # one compilation for every window
                for t in (*seen, valid):
                    torch._dynamo.mark_dynamic(t, t.dim() - 2 if t.dim() == 4 else 1)
            x = attend(x, q, *seen, valid, layer.o, layer.o_bias, layer.post_norm, layer.gate_up, layer.down, shape)
        s.choose(self._logits(x[:, -1]))
        s.position.add_(1)
        s.slot.add_(1)

    def _state(self, batch: int, length: int, generation, eos_ids, pad_id, device, dtype) -> "_State":
        """The buffers for `batch` sequences of up to `length` tokens with these sampling settings: kept from an
        earlier rollout where they are long enough, else new (the oldest dropped beyond STATES)."""
        settings = tuple(getattr(generation, k, None) for k in ("temperature", "top_k", "top_p", "min_p"))
        key = (batch, settings, tuple(eos_ids), pad_id)
        s = self._states.pop(key, None)
        if s is None or s.length < length + WINDOW:
            while len(self._states) >= STATES:
                self._states.pop(next(iter(self._states)))
            # One window more than any step attends over: a window never equals the cache's length, which
            # torch.compile would otherwise tie to it and compile again for the next window
            s = _State(self, batch, -(-length // WINDOW) * WINDOW + WINDOW, generation, eos_ids, pad_id, device,
                       dtype)
        self._states[key] = s  # the newest last
        return s

    def warm_up(self, prompt: list[int], batch: int, generation, eos_ids: list[int], pad_id: int) -> float:
        """Compiles the decode step and captures its graphs for `batch` copies of `prompt` (the longest a rollout
        will see) before training, so that the time counts as start-up; the random streams are left as they were,
        so the run trains as it would have without. Seconds taken."""
        torch = self.torch
        began = time.perf_counter()
        self.refresh()
        devices = [torch.cuda.current_device()] if self.embed.is_cuda else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            self.generate([list(prompt)] * batch, generation, eos_ids, pad_id)
        if self.embed.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - began

    def generate(self, prompts: list[list[int]], generation, eos_ids: list[int], pad_id: int, generator=None):
        """Completions of left-padded `prompts`, each up to and with its first EOS token, sampled as
        transformers' generate() samples with `generation` (temperature, top_k, top_p, min_p)."""
        torch = self.torch
        check_sampling(generation)
        if generator is not None and self.graphs:
            raise ValueError("a decode step replayed as a CUDA graph draws from the default CUDA generator: seed it "
                             "(torch.manual_seed) instead of passing a generator, or use Decoder(compiled=False)")
        self.refresh()
        device = self.embed.device
        dtype = self.embed.dtype
        b, p = len(prompts), max(len(x) for x in prompts)
        new = generation.max_new_tokens
        s = self._state(b, p + new, generation, eos_ids, pad_id, device, dtype)
        s.start(prompts, p, generator)
        tokens = torch.full((b, p), pad_id, dtype=torch.long, device=device)
        for i, prompt in enumerate(prompts):
            tokens[i, p - len(prompt):] = torch.tensor(prompt, device=device)
        positions = (s.valid[:, :p].long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(p, p, dtype=torch.bool, device=device).tril()
        # A padding position attends to itself only (its output is never used; a row with no key would be NaN)
        mask = (causal[None] & s.valid[:, None, :p]) | torch.eye(p, dtype=torch.bool, device=device)[None]
        prefix = [(keys[:, :, :p], values[:, :, :p]) for keys, values in s.cache]  # the prompt's slots
        out = torch.full((b, new), pad_id, dtype=torch.long, device=device)
        s.choose(self.forward(tokens, positions, prefix, 0, mask, s.rope))
        out[:, 0] = s.token
        s.position.copy_(positions[:, -1] + 1)
        s.slot.fill_(p)
        for step in range(1, new):
            if step % CHECK_EVERY == 1 and not s.unfinished.any():
                break
            slot = p + step - 1  # where this step's token goes
            s.step((slot // WINDOW + 1) * WINDOW)
            out[:, step] = s.token
        completions = []
        for row in out.tolist():
            ends = [i for i, token in enumerate(row) if token in eos_ids]
            completions.append(row[:ends[0] + 1] if ends else row)
        return completions


class _State:
    """The static buffers of one batch size: KV cache, attention mask, the current token, its position and cache
    slot, which sequences still run; and the decode step's CUDA graphs over them, one per attention window."""

    def __init__(self, decoder: Decoder, batch: int, length: int, generation, eos_ids, pad_id, device, dtype):
        torch = decoder.torch
        self.decoder, self.length = decoder, length
        self.cache = [(torch.zeros(batch, decoder.kv_heads, length, decoder.head_dim, device=device, dtype=dtype),
                       torch.zeros(batch, decoder.kv_heads, length, decoder.head_dim, device=device, dtype=dtype))
                      for _ in decoder.layers]
        self.rope = decoder.rope_tables(length, device, dtype)
        self.valid = torch.zeros((batch, length), dtype=torch.bool, device=device)
        self.token = torch.zeros(batch, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.unfinished = torch.ones(batch, dtype=torch.bool, device=device)
        self.eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
        self.pad = pad_id
        self.sampler = Sampler(generation)
        self.generator = None
        self.graphs: dict = {}  # attention window -> CUDA graph

    def start(self, prompts, width: int, generator) -> None:
        self.valid.zero_()
        for i, prompt in enumerate(prompts):
            self.valid[i, width - len(prompt):width] = True
        self.unfinished.fill_(True)
        self.generator = generator

    def choose(self, logits) -> None:
        torch = self.decoder.torch
        sampled = self.sampler(logits, self.generator)
        sampled = torch.where(self.unfinished, sampled, torch.full_like(sampled, self.pad))
        self.token.copy_(sampled)
        self.unfinished.logical_and_(~torch.isin(sampled, self.eos))

    def step(self, window: int) -> None:
        if not self.decoder.graphs:
            self.decoder._decode(self, window)
            return
        if window not in self.graphs:
            self.graphs[window] = self._capture(window)
        self.graphs[window].replay()

    def _capture(self, window: int):
        """The decode step over `window` slots as a CUDA graph over these buffers, after warm-up runs
        (compilation, autotuning) on a side stream; the buffers the warm-up moved are put back (the cache slot it
        wrote is written again by the step)."""
        torch = self.decoder.torch
        moved = (self.valid, self.token, self.position, self.slot, self.unfinished)
        saved = [t.clone() for t in moved]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.decoder._decode(self, window)
                self.slot.copy_(saved[3])
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.decoder._decode(self, window)
        for held, value in zip(moved, saved, strict=True):
            held.copy_(value)
        return graph


class Sampler:
    """transformers' warpers for `generation` in generate()'s order, applied after top_k to the top_k + TIES largest
    logits only (top_k removes the others whatever follows; TIES keeps the ties with the k-th that transformers
    keeps), and a draw by exponential races: the category with the largest p / E, E ~ Exp(1), is a draw from p,
    with no host synchronisation, so it can live in a CUDA graph."""

    def __init__(self, generation):
        from transformers.generation.logits_process import TopKLogitsWarper

        self.warpers = _warpers(generation)
        self.top_k = generation.top_k if any(isinstance(w, TopKLogitsWarper) for w in self.warpers) else 0
        self.narrow_at = next((i for i, w in enumerate(self.warpers) if isinstance(w, TopKLogitsWarper)), None)

    def distribution(self, logits):
        """The probabilities the settings give, and the token ids they are of (None: the whole vocabulary)."""
        import torch

        scores, ids = logits, None
        for i, warp in enumerate(self.warpers):
            if i == self.narrow_at:
                scores, ids = scores.topk(min(scores.shape[-1], self.top_k + TIES), dim=-1)
            scores = warp(None, scores)
        return torch.softmax(scores, dim=-1), ids

    def __call__(self, logits, generator=None):
        import torch

        probs, ids = self.distribution(logits)
        choice = (probs / torch.empty_like(probs).exponential_(generator=generator)).argmax(dim=-1)
        return choice if ids is None else ids.gather(1, choice[:, None]).squeeze(1)


def _rms(x, weight, eps):
    import torch

    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _project(x, input_norm, qkv, qkv_bias, q_norm, k_norm, cos, sin, shape):
    """A decode layer's first half: the normed input's q, k, v for one new token [B, 1, H], rotated."""
    import torch.nn.functional as F

    h, kvh, hd, eps = shape
    b = x.shape[0]
    y = F.linear(_rms(x, input_norm, eps), qkv, qkv_bias)
    q, k, v = y.split([h * hd, kvh * hd, kvh * hd], dim=-1)
    q, k = q.view(b, 1, h, hd), k.view(b, 1, kvh, hd)
    if q_norm is not None:
        q, k = _rms(q, q_norm, eps), _rms(k, k_norm, eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.view(b, 1, kvh, hd).transpose(1, 2)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v


def _attend(x, q, keys, values, valid, o, o_bias, post_norm, gate_up, down, shape):
    """A decode layer's second half: attention of the new token over the cache slots `valid` marks (each query
    head reads its group's key head, as SDPA's enable_gqa), the output projection, the MLP, the residuals."""
    import torch
    import torch.nn.functional as F

    h, kvh, hd, eps = shape
    b, length = x.shape[0], keys.shape[2]
    scores = torch.matmul(q.view(b, kvh, h // kvh, hd), keys.transpose(-1, -2)).to(torch.float32) * hd ** -0.5
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    y = torch.matmul(torch.softmax(scores, dim=-1).to(values.dtype), values)  # [B, kvh, group, hd]
    x = x + F.linear(y.reshape(b, 1, h * hd), o, o_bias)
    gate, up = F.linear(_rms(x, post_norm, eps), gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down)


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
