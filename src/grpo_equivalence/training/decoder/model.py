"""The decoder: the policy's merged weights, a prefill and a decode step over a static KV cache, and generate(),
which samples completions of left-padded prompts as transformers' generate() does (the package's docstring says
how)."""

import contextlib
import time
from dataclasses import fields

from . import weights
from .kernels import attend, linear, project, rms, rotate_half
from .sampling import check_sampling
from .state import State
from .weights import Layer, check_architecture, unmerged_of, weight_of

WINDOW = 64  # cache slots a decode step's attention window grows by (one CUDA graph per window)
STATES = 2  # KV caches (with their graphs) kept at once, one per batch size and sampling; a third drops the oldest
CHECK_EVERY = 16  # decode steps between two looks at whether every sequence has ended (a look waits for the GPU)


class Decoder:
    """The merged weights of a causal LM, and a prefill and a decode step over a static KV cache. `compiled`: the
    decode step compiled and replayed as CUDA graphs (None: on a GPU). `unmerged`: no merged copy; every step
    reads the trainer's own weights and adapters where they lie (weights.unmerged_layer), so that an optimizer
    step reaches it without a merge, at the cost of the adapters' own small products in every step."""

    def __init__(self, model, compiled: bool | None = None, unmerged: bool = False):
        import torch

        self.lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        c = self.lm.config
        check_architecture(c)
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.unmerged = unmerged
        self._version = self._where = None
        self.layers = None
        self.torch = torch
        device = next(model.parameters()).device
        self.compiled = device.type == "cuda" if compiled is None else compiled
        self.graphs = device.type == "cuda" and self.compiled
        self._states: dict = {}  # (batch, cache length) -> State, oldest first
        self._project = self._attend = None
        self.recorder = None  # where a generate() call's steps go (recording)
        self._recording = None  # the rollout check's Recorder (training.sampler_logits)

    @contextlib.contextmanager
    def recording(self, recorder):
        """Every generate() call of the block hands its steps' logits (float32, before the sampler's warpers) and
        sampled tokens to a new recorder.start(); the decode step runs eagerly meanwhile (the same kernels, compiled
        where the decoder is, without CUDA graphs, which cannot call back into Python)."""
        self._recording = recorder
        try:
            yield
        finally:
            self._recording = None

    def version(self) -> tuple:
        return tuple(p._version for p in self.trainable) + tuple(p.data_ptr() for p in self.trainable)

    def refresh(self) -> bool:
        """Merges the weights again when a trainable one changed since the last merge; whether it did. A new merge
        is written, one layer at a time, into the tensors of the first one (the decode graphs hold their
        addresses): it never holds a second merged copy of the model, which would be the run's peak memory."""
        version = self.version()
        if version == self._version:
            return False
        if self.unmerged:
            return self._read_in_place(version)
        with self.torch.no_grad():
            inner = self.lm.model
            self.embed = inner.embed_tokens.weight.detach()
            self.norm = inner.norm.weight.detach()
            if self.layers is None:
                self.layers = [weights.merged_layer(block) for block in inner.layers]
                self.lm_head, self.lm_head_bias = weight_of(self.lm.lm_head)
            else:
                owned = {p.data_ptr() for p in self.lm.parameters()}
                for held, block in zip(self.layers, inner.layers, strict=True):
                    fresh = weights.merged_layer(block)  # one layer's merge at a time
                    for f in fields(Layer):
                        setattr(held, f.name, self._into(getattr(held, f.name), getattr(fresh, f.name), owned))
                    del fresh  # freed before the next layer's merge
                head = weight_of(self.lm.lm_head)
                self.lm_head, self.lm_head_bias = (self._into(self.lm_head, head[0], owned),
                                                   self._into(self.lm_head_bias, head[1], owned))
        self._version = version
        return True

    def _read_in_place(self, version: tuple) -> bool:
        """Unmerged: the layers are the trainer's own tensors, which an optimizer step changes in place and the
        decode step then reads as they are; they are read again (and the graphs captured anew) only where a tensor
        moved or an adapter was turned on or off. Whether they were read again."""
        inner = self.lm.model
        where = (version[len(self.trainable):], tuple(
            (getattr(m, "disable_adapters", False), getattr(m, "merged", False)) for m in self.lm.modules()
            if hasattr(m, "get_delta_weight")))
        self._version = version
        if self.layers is not None and where == self._where:
            return False
        self._where = where
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach()
        self.layers = [weights.unmerged_layer(block) for block in inner.layers]
        self.lm_head, self.lm_head_bias = unmerged_of(self.lm.lm_head), None
        self._states.clear()
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
        return rms(x, weight, self.eps)

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
            qkv = linear(y, layer.qkv, layer.qkv_bias)
            q, k, v = qkv.split([h * hd, kvh * hd, kvh * hd], dim=-1)
            q = q.view(b, t, h, hd)
            k = k.view(b, t, kvh, hd)
            if layer.q_norm is not None:
                q, k = self._rms(q, layer.q_norm), self._rms(k, layer.k_norm)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = v.view(b, t, kvh, hd).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            keys[:, :, start:start + t] = k
            values[:, :, start:start + t] = v
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None], enable_gqa=kvh != h)
            x = residual + linear(y.transpose(1, 2).reshape(b, t, h * hd), layer.o, layer.o_bias)
            residual = x
            y = self._rms(x, layer.post_norm)
            gate, up = linear(y, layer.gate_up).chunk(2, dim=-1)
            x = residual + linear(F.silu(gate) * up, layer.down)
        return self._logits(x[:, -1])

    def _logits(self, x):
        return linear(self._rms(x, self.norm), self.lm_head, self.lm_head_bias).to(self.torch.float32)

    def _kernels(self):
        """The two halves of a decode layer, compiled when the decoder is (one compilation serves every layer)."""
        if self._project is None:
            if self.compiled:
                compile = lambda f: self.torch.compile(f, fullgraph=True)  # noqa: E731
                self._project, self._attend = compile(project), compile(attend)
            else:
                self._project, self._attend = project, attend
        return self._project, self._attend

    def _decode(self, s: "State", window: int) -> None:
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

    def _state(self, batch: int, length: int, generation, eos_ids, pad_id, device, dtype) -> "State":
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
            s = State(self, batch, -(-length // WINDOW) * WINDOW + WINDOW, generation, eos_ids, pad_id, device,
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
        self.recorder = self._recording.start() if self._recording is not None else None
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
        self.recorder = None
        completions = []
        for row in out.tolist():
            ends = [i for i, token in enumerate(row) if token in eos_ids]
            completions.append(row[:ends[0] + 1] if ends else row)
        return completions


