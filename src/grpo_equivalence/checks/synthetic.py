"""Rollout checks of synthetic samplers whose truth is known: logits a model "truly" computes, a sampler and a scorer
that each compute them with their own rounding error, and the rollout-check file the two make. The tests
(tests/test_power.py) and the calibration benchmark (benchmarks/rollout_calibration.py) measure the check on them."""

from ..training import faults
from . import power, scoring

STUDY = {"temperature": 0.1, "top_k": 5, "top_p": 0.97, "min_p": 0.5}  # config.yaml's sampling
TINY = {"temperature": 1.0, "top_k": 5, "top_p": 0.97, "min_p": 0.05}
LENGTH = 50  # tokens per synthetic completion


def rounded(values, dtype: str):
    import torch

    return values.to(getattr(torch, dtype)).float()


def logits(n: int, scale: float, generator, vocabulary: int = 20):
    """What a model "truly" computes at n positions: a few leading tokens near each other, as a trained model has."""
    import torch

    base = torch.randn((n, vocabulary), generator=generator) * scale
    return base + 4 * scale * (torch.arange(vocabulary) < 3).float()


def sample(truth, settings: dict, dtype: str, generator, noise: float = 0.5):
    """A correct sampler of `settings` on its own logits: the truth with its kernels' error (`noise` rounding steps
    of the logit, before the final rounding to dtype), and the scorer's logits, computed with other kernels."""
    import torch

    step = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -8}[dtype] * truth.abs().clamp_min(1.0)

    def computed():
        return rounded(truth + noise * step * torch.randn(truth.shape, generator=generator), dtype)

    sampler, scorer = computed(), computed()
    q = torch.softmax(scoring.processors(settings)(torch.zeros((len(truth), 1), dtype=torch.long), sampler.clone()), -1)
    return scorer, torch.multinomial(q, 1, generator=generator).squeeze(1)


def check(truth, sampler_settings, dtype, generator, *, margin=0.05, rounding=None) -> dict:
    """A rollout-check file's content from synthetic positions, scored under the settings the sampler's were made
    from (`faulty`'s "_settings"), or the sampler's own."""
    tokens_scorer, tokens = sample(truth, sampler_settings, dtype, generator)
    settings = sampler_settings.get("_settings", sampler_settings)
    scored = scoring.score_tokens(tokens_scorer, tokens, {k: v for k, v in settings.items() if k != "_settings"},
                                  rounding=scoring.ROUNDING[dtype] if rounding is None else rounding, margin=margin)
    profile, completions = power.empty_profile(faults.SAMPLING), []
    for start in range(0, len(tokens), LENGTH):
        part = {k: ({a: b[start:start + LENGTH] for a, b in v.items()} if isinstance(v, dict)
                    else v[start:start + LENGTH]) for k, v in scored.items()}
        sums = scoring.completion_sums(part)
        power.add(profile, sums, scoring.effect_sums(part))
        completions.append({"prompt": start // LENGTH, "reward": 1.0, **sums})
    return {"backend": "synthetic", "seed": 0, "sampling": settings, "completions": completions, "profile": profile}


def faulty(fault: str, settings: dict) -> dict:
    """A sampler's settings with `fault` injected, remembering the settings the scorer judges it by."""
    return {**faults.sampler_settings(fault, settings), "_settings": settings}
