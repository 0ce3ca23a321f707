"""Rollout checks of synthetic samplers whose truth is known: logits a model "truly" computes, a sampler and a scorer
that each compute them with their own rounding error, and the rollout-check file the two make (with `own`, as a
backend that reports its sampler's logits makes it: its sampler judged on them, its numerics against the
scorer's). The tests (tests/test_power.py, tests/test_exact.py) and the calibration benchmark
(benchmarks/rollout_calibration.py) measure the check on them."""

from ..training import faults
from . import exact, power, scoring

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


def sample(truth, settings: dict, dtype: str, generator, noise: float = 0.5, *, sampler_noise: float | None = None,
           with_sampler: bool = False):
    """A correct sampler of `settings` on its own logits: the truth with its kernels' error (`noise` rounding steps
    of the logit, before the final rounding to dtype; `sampler_noise` for the sampler's, a numerics fault where it is
    larger), and the scorer's logits, computed with other kernels. `settings` may carry drop_weakest's rule
    (faults.sampler_settings). Returns the scorer's logits, the tokens, and with_sampler the sampler's logits."""
    import torch

    step = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -8}[dtype] * truth.abs().clamp_min(1.0)

    def computed(size):
        return rounded(truth + size * step * torch.randn(truth.shape, generator=generator), dtype)

    sampler, scorer = computed(noise if sampler_noise is None else sampler_noise), computed(noise)
    q = torch.softmax(scoring.filtered({k: v for k, v in settings.items() if k != "_settings"}, "transformers",
                                       sampler), -1)
    tokens = torch.multinomial(q, 1, generator=generator).squeeze(1)
    return (scorer, tokens, sampler) if with_sampler else (scorer, tokens)


def check(truth, sampler_settings, dtype, generator, *, margin=0.05, rounding=None, own: bool = False,
          sampler_noise: float | None = None) -> dict:
    """A rollout-check file's content from synthetic positions, scored under the settings the sampler's were made
    from (`faulty`'s "_settings"), or the sampler's own; `own`: as a backend that reports its sampler's logits."""
    tokens_scorer, tokens, sampler = sample(truth, sampler_settings, dtype, generator, sampler_noise=sampler_noise,
                                            with_sampler=True)
    settings = {k: v for k, v in sampler_settings.get("_settings", sampler_settings).items() if k != "_settings"}
    scored = scoring.score_tokens(tokens_scorer, tokens, settings,
                                  rounding=scoring.ROUNDING[dtype] if rounding is None else rounding, margin=margin)
    views = [{"full": sampler, "tokens": tokens}]
    mine = exact.score_own(views, settings, margin=margin, order="transformers", vocabulary=truth.shape[1]) \
        if own else None
    sampler_logp = exact.raw_logprobs(views).tolist() if own else None
    scorer_logp = torch_logprobs(tokens_scorer, tokens) if own else None
    profile, own_profile, completions = power.empty_profile(faults.SAMPLING), power.empty_profile(faults.SAMPLING), []
    for start in range(0, len(tokens), LENGTH):
        part = _part(scored, start)
        sums = scoring.completion_sums(part)
        power.add(profile, sums, scoring.effect_sums(part))
        if own:
            part = _part(mine, start)
            own_sums = scoring.completion_sums(part)
            power.add(own_profile, own_sums, scoring.effect_sums(part))
            sums.update({f"own_{k}": v for k, v in own_sums.items() if k != "tokens"}, own_unjudged=0)
            sums.update(exact.numerics_sums(sampler_logp[start:start + LENGTH], scorer_logp[start:start + LENGTH]))
        completions.append({"prompt": start // LENGTH, "reward": 1.0, **sums})
    run = {"backend": "synthetic", "seed": 0, "sampling": settings, "completions": completions, "profile": profile,
           "dtype": dtype, "sampler_logits": "synthetic" if own else None, "own_profile": own_profile if own else None}
    run["numerics"] = exact.numerics_figures(completions)
    return run


def _part(scored: dict, start: int) -> dict:
    return {k: ({a: b[start:start + LENGTH] for a, b in v.items()} if isinstance(v, dict) else v[start:start + LENGTH])
            for k, v in scored.items()}


def torch_logprobs(logits, tokens) -> list[float]:
    """Each token's raw log-probability under `logits` (temperature 1, no filter)."""
    import torch

    return torch.log_softmax(logits.float(), -1).gather(1, tokens[:, None]).squeeze(1).tolist()


def faulty(fault: str, settings: dict) -> dict:
    """A sampler's settings with `fault` injected, remembering the settings the scorer judges it by."""
    return {**faults.sampler_settings(fault, settings), "_settings": settings}
