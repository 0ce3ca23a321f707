"""The logits a backend's sampler drew each token from, as the sampler saw them: raw, before its temperature and
filters (top_k, top_p, min_p), reported by the backend itself for every token it sampled.

On these the rollout check applies the settings exactly (grpo_equivalence.checks.scoring.score_own): the same
numbers the sampler had, so no rounding between two computations of the logits decides anything, at any
temperature and precision. Each backend reports them through its own outputs (Backend.sampler_logits):

- "generate" (hf, hf_static): a logits processor that transformers' generate() runs after its own processors and
  before its sampling warpers (generate() merges a caller's processors there), added to every generate() call of
  the trainer's model;
- "native": the project's decoder hands every step's logits to a recorder (its decode step then runs without
  CUDA graphs: the same compiled kernels, replayed by Python);
- "vllm" (trl_vllm): vLLM's own raw log-probabilities (its sampler's logprobs mode "raw_logprobs": log_softmax of
  the logits before any processing), the TOP most likely tokens and the sampled one, at every position.

A position of a vocabulary of up to FULL_VOCABULARY logits is kept whole; of a larger one, its TOP largest logits
(at least top_k), the sampled token's and the log-sum-exp of the whole row (what the rest's mass needs).
"""

import contextlib
import math

FULL_VOCABULARY = 4096
TOP = 20  # vLLM's own cap on the log-probabilities a request may ask for (max_logprobs)
VLLM_MODE = "raw_logprobs"


def top_count(settings: dict) -> int:
    """The largest logits a narrowed position keeps: every token top_k could keep, and at least TOP."""
    return max(TOP, int(settings.get("top_k") or 0))


class Steps:
    """One generation call's recorded steps, each (rows, V) logits or their narrowing, and per row its views."""

    def __init__(self, top: int):
        self.top, self.steps, self.tokens, self.pending = top, [], [], None

    def add(self, scores, tokens=None) -> None:
        """One step's logits (rows, vocabulary, float32); its sampled tokens now or, None, with the next step's."""
        import torch

        scores = scores.detach().float()
        if self.pending is not None:
            raise RuntimeError("a step's logits were recorded before the previous step's tokens")
        if scores.shape[-1] <= FULL_VOCABULARY:
            entry = {"full": scores.cpu()}
        else:
            values, ids = scores.topk(min(self.top, scores.shape[-1]), dim=-1)
            entry = {"top": values.cpu(), "ids": ids.cpu(), "lse": torch.logsumexp(scores, -1).cpu(), "row": scores}
        self.steps.append(entry)
        if tokens is None:
            self.pending = entry
        else:
            self._tokens(entry, tokens)

    def sampled(self, tokens) -> None:
        """The tokens sampled at the last step recorded (generate() shows them with the next step's input)."""
        if self.pending is not None:
            entry, self.pending = self.pending, None
            self._tokens(entry, tokens)

    def _tokens(self, entry: dict, tokens) -> None:
        tokens = tokens.detach().long().to(entry.get("row", entry.get("full")).device)
        row = entry.pop("row", None)
        entry["token_logit"] = (row if row is not None else entry["full"].to(tokens.device)).gather(
            1, tokens[:, None]).squeeze(1).cpu()
        entry["tokens"] = tokens.cpu()

    def views(self) -> list[dict]:
        """Per row of the call, its positions' recorded logits (tensors over its steps)."""
        import torch

        if self.pending is not None:
            raise RuntimeError("the last step's sampled tokens were never recorded")
        if not self.steps:
            return []
        stacked = {key: torch.stack([s[key] for s in self.steps], dim=1) for key in self.steps[0]}
        return [{key: value[i] for key, value in stacked.items()} for i in range(len(stacked["tokens"]))]


def view_of_logprobs(top_ids: list[list[int]], top_values: list[list[float]], tokens: list[int]) -> dict:
    """A completion's positions as vLLM reports them (raw log-probabilities, the most likely first and the sampled
    token among them) in the form Steps.views gives: narrowed, the row's log-sum-exp 0 (they are normalised)."""
    import torch

    width = max(len(ids) for ids in top_ids) if top_ids else 0
    ids = torch.full((len(tokens), width), -1, dtype=torch.long)
    values = torch.full((len(tokens), width), -math.inf)
    token_logit = torch.empty(len(tokens))
    for t, (position_ids, position_values, token) in enumerate(zip(top_ids, top_values, tokens, strict=True)):
        pairs = {i: v for i, v in zip(position_ids, position_values, strict=True) if v is not None}
        if token not in pairs:
            raise RuntimeError(f"vLLM reported no log-probability of the sampled token {token} at position {t}")
        token_logit[t] = pairs[token]
        ordered = sorted(pairs.items(), key=lambda pair: -pair[1])
        ids[t, :len(ordered)] = torch.tensor([i for i, _ in ordered])
        values[t, :len(ordered)] = torch.tensor([v for _, v in ordered])
    return {"top": values, "ids": ids, "lse": torch.zeros(len(tokens)), "token_logit": token_logit,
            "tokens": torch.tensor(tokens, dtype=torch.long)}


class Recorder:
    """What a backend's sampler drew from, for the rows of each generation call since the last take()."""

    def __init__(self, top: int):
        self.top, self.calls = top, []

    def start(self) -> Steps:
        self.calls.append(Steps(self.top))
        return self.calls[-1]

    def take(self, completions: list[list[int]]) -> list[dict]:
        """Each row's views, cut to its completion's length; refused unless the tokens recorded are the
        completion's (the views then are what its tokens were drawn from)."""
        views = [view for steps in self.calls for view in steps.views()]
        self.calls = []
        if len(views) != len(completions):
            raise RuntimeError(f"the sampler reported logits for {len(views)} sequences, the rollout returned "
                               f"{len(completions)}: the recorder missed a generation call")
        cut = []
        for i, (view, ids) in enumerate(zip(views, completions, strict=True)):
            if len(view["tokens"]) < len(ids) or view["tokens"][:len(ids)].tolist() != list(ids):
                raise RuntimeError(f"sequence {i}: the tokens the sampler recorded are not its completion's "
                                   f"({view['tokens'][:len(ids)].tolist()[:8]}... against {list(ids)[:8]}...)")
            cut.append({key: value[:len(ids)] for key, value in view.items()})
        return cut


@contextlib.contextmanager
def recording(trainer, mechanism: str | None, settings: dict):
    """A Recorder of the trainer's rollout for the block, by `mechanism` (Backend.sampler_logits); None where the
    backend cannot report what its sampler drew from (the check then scores with the trainer's logits only)."""
    if mechanism is None:
        yield None
        return
    recorder = Recorder(top_count(settings))
    install = {"generate": _generate, "native": _native, "vllm": _vllm}[mechanism]
    with install(trainer, recorder):
        yield recorder


@contextlib.contextmanager
def _generate(trainer, recorder: Recorder):
    from transformers import LogitsProcessor, LogitsProcessorList

    class Record(LogitsProcessor):
        def __init__(self, steps: Steps, prompt_width: int):
            self.steps, self.width = steps, prompt_width

        def __call__(self, input_ids, scores):
            if input_ids.shape[1] > self.width:  # the token the previous step sampled
                self.steps.sampled(input_ids[:, -1])
            self.steps.add(scores)
            return scores

    model = trainer.model
    own = model.__dict__.get("generate")
    generate = model.generate

    def recorded(*args, **kwargs):
        inputs = kwargs.get("input_ids", args[0] if args else None)
        steps = recorder.start()
        given = list(kwargs.pop("logits_processor", None) or [])
        out = generate(*args, logits_processor=LogitsProcessorList([*given, Record(steps, inputs.shape[1])]),
                       **kwargs)
        sequences = out.sequences if hasattr(out, "sequences") else out
        steps.sampled(sequences[:, inputs.shape[1] + len(steps.steps) - 1])
        return out

    model.generate = recorded
    try:
        yield
    finally:
        if own is None:
            del model.generate
        else:
            model.generate = own


@contextlib.contextmanager
def _native(trainer, recorder: Recorder):
    decoder = getattr(trainer, "native_decoder", None)
    if decoder is None:
        raise RuntimeError("backend 'native' left no decoder on its trainer (trainer.native_decoder)")
    with decoder.recording(recorder):
        yield


@contextlib.contextmanager
def _vllm(trainer, recorder: Recorder):
    """vLLM's sampler returns raw log-probabilities for the block (its logprobs mode set through the engine's RPC:
    log_softmax of the float32 logits before any processing), TOP of them and the sampled token's per position,
    and each generation call's are kept; TRL's own asks (logprobs 0, processed) come back after it."""
    vllm = trainer.vllm_generation
    modes = vllm.llm.collective_rpc(_logprobs_mode, args=(VLLM_MODE,))
    asked, generate = vllm.logprobs, vllm.generate

    def recorded(*args, **kwargs):
        output = generate(*args, **kwargs)
        _, completion_ids, logprobs, logprob_ids = output
        if logprobs is None or logprob_ids is None:
            raise RuntimeError("vLLM returned no log-probabilities although the check asked for them")
        steps = recorder.start()
        steps.views = lambda: [view_of_logprobs(ids, values, list(tokens))
                               for ids, values, tokens in zip(logprob_ids, logprobs, completion_ids, strict=True)]
        return output

    vllm.logprobs, vllm.generate = recorder.top, recorded
    try:
        yield
    finally:
        vllm.logprobs, vllm.generate = asked, generate
        vllm.llm.collective_rpc(_logprobs_mode, args=(modes[0],))


def _logprobs_mode(worker, state: str | dict) -> dict:
    """On each of a vLLM engine's workers (its RPC): its sampler returns `state` log-probabilities ("raw_logprobs"),
    or gets back the state _logprobs_mode returned; the state it had. How it samples stays as training has it: vLLM
    0.26 picks its path from the logprobs mode (where TRL asks for processed log-probabilities, the PyTorch top-k/top-p
    function with its Triton kernel; otherwise FlashInfer's sampler where installed), so the path is pinned: the
    model runner's sampler does not switch to FlashInfer, and the older runner's top-k/top-p sampler keeps the path it
    chose at the engine's start."""
    sampler = worker.model_runner.sampler
    inner = getattr(sampler, "topk_topp_sampler", None)  # vLLM's first model runner: a sampler of its own
    own = {"mode": sampler.logprobs_mode, "inner": getattr(inner, "logprobs_mode", None),
           "flashinfer": getattr(sampler, "use_flashinfer", None)}
    if isinstance(state, str):
        state = {"mode": state, "inner": state if inner is not None else None,
                 "flashinfer": False if own["flashinfer"] is not None else None}
    sampler.logprobs_mode = state["mode"]
    if inner is not None:
        inner.logprobs_mode = state["inner"]
    if state["flashinfer"] is not None:
        sampler.use_flashinfer = state["flashinfer"]
    return own
