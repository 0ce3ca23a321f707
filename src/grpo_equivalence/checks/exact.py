"""The rollout check's two questions, on the logits a backend's sampler reported (training.sampler_logits):

- the sampler: the settings applied to the very logits it drew from, in its own order of the filters
  (score_own). No rounding between two computations of the logits decides anything: every drawn token must be in
  the kept set, and log q(x) + H(q) has mean 0 and a known variance at every position, at temperature 0.1 in
  bfloat16 as at 1.0 in float32. The only band left is SAMPLER_ROUNDING, the float32 arithmetic of the filters
  themselves (a softmax and a cumulative sum computed on another device in another order);
- the numerics: the sampler's log-probability of each drawn token against the trainer's at the same weights, both
  raw (the whole vocabulary at temperature 1, before any filter: like against like), per completion in the sums
  numerics_sums keeps. A processed, renormalised sampler log-probability against the trainer's raw one (what an
  importance-sampling ratio of a top_p sampler compares) is biased by the mass the filters drop.
"""

import math

from . import scoring

SAMPLER_ROUNDING = 1e-6  # relative to the largest logit: float32 filter arithmetic, nothing of the logits' dtype
# Per completion, the numerics' sums (the verdict's and the report's figures come from them)
NUMERICS_KEYS = ("numerics_tokens", "abs_diff", "max_abs_diff", "mult_error", "k3", "ratio_outside", "signed_diff")
RATIO_BOUNDS = (0.5, 2.0)  # an importance ratio outside these is counted (verl's rollout-correction health check)


def _narrowed(view: dict, vocabulary: int, order: str):
    """A narrowed position set (training.sampler_logits): its logits with the sampled token as a column of its own
    (appended where it is not among the largest; a column that is never kept otherwise), the token's column, and
    the rest of the vocabulary as one logit for a sampler's settings: none where its filters drop every token of
    the rest whatever their logits (a top_k within the largest reported; min_p above the smallest reported, where
    no top_p normalises before it), else the rest's mass in one token: exact at temperature 1 (the row's
    log-sum-exp is reported), an upper bound at others (every token of the rest is below the smallest reported)."""
    import torch

    top, ids, tokens = view["top"].float(), view["ids"], view["tokens"]
    among = ids == tokens[:, None]
    missing = ~among.any(-1)
    extra = torch.where(missing, view["token_logit"].float(), torch.full_like(view["token_logit"].float(), -math.inf))
    values = torch.cat([top, extra[:, None]], -1)
    local = torch.where(missing, top.shape[1], among.int().argmax(-1))
    share = torch.exp(values - view["lse"].float()[:, None]).nansum(-1)
    rest_lse = view["lse"].float() + torch.log1p(-share.clamp(max=1.0))  # -inf where nothing is left
    smallest = torch.where(torch.isfinite(top), top, torch.full_like(top, math.inf)).amin(-1)
    others = max(1, vocabulary - values.shape[1])
    largest = top[:, 0]
    none = torch.full_like(rest_lse, -math.inf)

    def rest(settings: dict):
        temperature = settings.get("temperature") or 1.0
        if 0 < (settings.get("top_k") or 0) <= top.shape[1]:  # each token of the rest ranks below top_k others
            return none
        mass = torch.minimum(rest_lse, (1 - temperature) * smallest + temperature * rest_lse) if temperature <= 1 \
            else rest_lse + (temperature - 1) * math.log(others)
        if settings.get("min_p") and (order == "vllm" or (settings.get("top_p") or 1.0) >= 1.0):
            below = smallest < largest + temperature * math.log(settings["min_p"])  # min_p drops all of the rest
            return torch.where(below, none, mass)
        return mass

    return values, local, rest


def score_own(views: list[dict], settings: dict, *, margin: float, order: str, vocabulary: int) -> dict:
    """score_tokens' lists for the positions of `views` (one completion's each, joined), scored on the sampler's own
    logits; a narrowed position where the settings could keep part of the rest of the vocabulary is not judged
    (`unjudged`: neither decided nor outside). A token counts as clearly outside only at a decided position: where
    two logits tie at the edge of the support (bfloat16 has many ties), which of them top_k and top_p keep is their
    sort's choice, which another device's sort may make otherwise."""
    import torch

    tokens = torch.cat([v["tokens"] for v in views])
    if "full" in views[0]:
        scored = scoring.score_tokens(torch.cat([v["full"] for v in views]), tokens, settings,
                                      rounding=SAMPLER_ROUNDING, margin=margin, order=order)
        scored["unjudged"] = [False] * len(tokens)
        scored["outside_clear"] = [c and d for c, d in zip(scored["outside_clear"], scored["decided"], strict=True)]
        return scored
    joined = {key: torch.cat([v[key] for v in views]) for key in ("top", "ids", "tokens", "token_logit", "lse")}
    values, local, rest = _narrowed(joined, vocabulary, order)
    scored, exact = scoring._score(values, local, settings, SAMPLER_ROUNDING, margin, order, rest=rest,
                                   settings_only=True)
    for key in ("decided", "outside", "outside_clear"):
        scored[key] = scored[key] & exact
    scored["outside_clear"] &= scored["decided"]
    scored["logq"] = torch.where(exact, scored["logq"], torch.zeros_like(scored["logq"]))
    lists = scoring._as_lists(scored)
    lists["unjudged"] = (~exact).tolist()
    return lists


def raw_logprobs(views: list[dict]):
    """The sampler's log-probability of each drawn token at temperature 1 with no filter, from its own logits."""
    import torch

    if "full" in views[0]:
        return torch.cat([torch.log_softmax(v["full"].float(), -1).gather(1, v["tokens"][:, None]).squeeze(1)
                          for v in views])
    return torch.cat([v["token_logit"].float() - v["lse"].float() for v in views])


def numerics_sums(sampler, trainer) -> dict:
    """One completion's numerics from its tokens' raw log-probabilities, the sampler's and the trainer's (lists or
    tensors): d = sampler - trainer and r = -d (the log importance ratio, trainer over sampler); the sums of |d|,
    exp(|d|) (NeMo-RL's token_mult_prob_error), k3 = exp(r) - 1 - r (an estimate of KL(sampler || trainer) under
    the sampler's draws), d, the largest |d| and the tokens whose ratio exp(r) is outside RATIO_BOUNDS."""
    d = [float(a) - float(b) for a, b in zip(sampler, trainer, strict=True)]
    low, high = (math.log(bound) for bound in RATIO_BOUNDS)
    return {"numerics_tokens": len(d), "abs_diff": sum(abs(x) for x in d),
            "max_abs_diff": max((abs(x) for x in d), default=0.0), "mult_error": sum(math.exp(abs(x)) for x in d),
            "k3": sum(math.exp(-x) - 1 + x for x in d), "ratio_outside": sum(not low <= -x <= high for x in d),
            "signed_diff": sum(d)}


def numerics_figures(completions: list[dict]) -> dict | None:
    """A check's numerics over its completions: per token means (and the largest |d|, the share outside the
    ratio bounds); None where the backend reported no logits."""
    tokens = sum(c.get("numerics_tokens", 0) for c in completions)
    if not tokens:
        return None
    total = {key: sum(c[key] for c in completions) for key in ("abs_diff", "mult_error", "k3", "ratio_outside",
                                                                "signed_diff")}
    return {"tokens": tokens, "mean_abs_logp_diff": total["abs_diff"] / tokens,
            "max_abs_logp_diff": max(c["max_abs_diff"] for c in completions),
            "token_mult_prob_error": total["mult_error"] / tokens, "k3_kl": total["k3"] / tokens,
            "ratio_outside_share": total["ratio_outside"] / tokens, "mean_logp_diff": total["signed_diff"] / tokens}
