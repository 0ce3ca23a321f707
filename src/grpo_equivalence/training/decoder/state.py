"""The static buffers of one batch size (KV cache, mask, the current token, its position and cache slot) and the
decode step's CUDA graphs over them, one per attention window."""

from .sampling import Sampler


class State:
    """The static buffers of one batch size: KV cache, attention mask, the current token, its position and cache
    slot, which sequences still run; and the decode step's CUDA graphs over them, one per attention window."""

    def __init__(self, decoder, batch: int, length: int, generation, eos_ids, pad_id, device, dtype):
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
        if self.decoder.recorder is not None:  # what the sampler drew from (training.sampler_logits)
            self.decoder.recorder.add(logits, sampled)

    def step(self, window: int) -> None:
        if not self.decoder.graphs or self.decoder.recorder is not None:  # a recorder is Python: no graph holds it
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

