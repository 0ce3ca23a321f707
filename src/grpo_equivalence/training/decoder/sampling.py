"""Sampling as transformers' generate() samples: its own warpers, in its order, on float32 logits, and a draw that
needs no host synchronisation (so that it can live in a CUDA graph)."""


# What of a GenerationConfig this decoder implements, and what does not change what is sampled (token ids, the KV
# cache, the output's form). Any other setting is refused by name, unless it holds the value that means "off"
# (OFF): an allow-list, so that a setting transformers adds later is refused rather than silently ignored.
IMPLEMENTED = ("temperature", "top_k", "top_p", "min_p", "max_new_tokens", "do_sample")
NEUTRAL = ("pad_token_id", "bos_token_id", "eos_token_id", "use_cache", "cache_implementation", "disable_compile",
           "max_length", "return_dict_in_generate", "output_scores", "output_logits", "output_attentions",
           "output_hidden_states", "transformers_version", "_from_model_config", "compile_config")
OFF = {"repetition_penalty": 1.0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "num_beams": 1,
       "no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0, "length_penalty": 1.0, "num_return_sequences": 1}


TIES = 16  # logits beyond top_k drawn among, so that ties with the k-th are kept as transformers keeps them


def unsupported(settings: dict) -> list[str]:
    """The settings (name: value) that change sampling in a way this decoder does not implement, as name=value."""
    return [f"{key}={value!r}" for key, value in settings.items()
            if key not in IMPLEMENTED and key not in NEUTRAL and value is not None and value != OFF.get(key, None)]


def study_problems(grpo: dict) -> list[str]:
    """The study's sampling settings backend 'native' does not implement (its `grpo` section: repetition_penalty and
    generation_kwargs reach the GenerationConfig), each by name, before any job."""
    settings = {"repetition_penalty": grpo.get("repetition_penalty"), **(grpo.get("generation_kwargs") or {})}
    found = unsupported(settings)
    if grpo.get("generation_kwargs", {}).get("do_sample") is False:
        found.append("do_sample=False")
    return found


def check_sampling(generation) -> None:
    problems = unsupported(generation.to_diff_dict())
    if getattr(generation, "max_new_tokens", None) is None:
        problems.append("no max_new_tokens")
    if not getattr(generation, "do_sample", True):
        problems.append("do_sample=False")
    if problems:
        raise ValueError(f"backend 'native' samples with temperature, top_k, top_p and min_p only; this study's "
                         f"generation also sets {', '.join(problems)}: remove them, or use backend 'hf'")


class Sampler:
    """transformers' warpers for `generation` in generate()'s order, applied after top_k to the top_k + TIES largest
    logits only (top_k removes the others whatever follows; TIES keeps the ties with the k-th that transformers
    keeps), and a draw by exponential races: the category with the largest p / E, E ~ Exp(1), is a draw from p,
    with no host synchronisation, so it can live in a CUDA graph."""

    def __init__(self, generation):
        from transformers.generation.logits_process import TopKLogitsWarper

        self.warpers = warpers(generation)
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


def warpers(generation) -> list:
    """transformers' own sampling warpers for `generation`, in generate()'s order."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

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

