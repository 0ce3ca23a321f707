"""Scoring sampled tokens under the distribution the sampling settings define, with the rounding taken into account.

The settings define q: the logits at temperature, then top-k, top-p and min-p as transformers applies them. The
sampler and the scorer compute the logits with different kernels; in 16-bit arithmetic they differ by a few
rounding steps of the largest logit. At a cold sampler that decides a great deal: at temperature 0.1 and min_p
0.5 the settings keep the tokens within 0.1 x ln 2 = 0.069 of the largest logit, less than one bfloat16 rounding
step of a logit of 20 (0.125). Where the rounding can move a token across the edge of the support, the two sides
disagree on what the settings keep, and a sampler that is right by its own logits looks wrong by the scorer's.

So every quantity is judged where sampling decides, against a rounding band b = tolerance x max(1, |largest
logit|) (ROUNDING: a relative tolerance per dtype, a few of its rounding steps):
- a sampled token is *clearly outside* the support if it stays outside with its logit raised by b against the
  rest: no rounding of that size could have let the sampler keep it;
- a position is *decided* if its support stays the same when the weakest kept token is lowered by b or the
  strongest dropped one raised by b. The score test uses decided positions only: there the sampler and the
  scorer agree on the support, and log q(x) + H(q) has mean 0 and a variance known exactly under correct
  sampling. The choice depends on the scorer's logits alone, never on the token drawn, so it biases nothing.
  (Counting every position instead is what made a correct bfloat16 sampler score z = +38 on its own: the tokens
  the rounding let it draw outside were dropped from the sum, the ones it rounded away were never drawn.)

Per position it also gives what an alternative sampler would do at the same logits: a sampler hotter or colder
by the score test's margin (its equivalence bounds, with their variances) and each named sampling fault
(grpo_equivalence.training.faults.SAMPLING): its mean shift of the score and variance at decided positions, the
chance it draws a clearly-outside token, and how far its distribution is from q at all (total variation). From
these grpo_equivalence.checks.power states what the check can detect at the study's settings and size.
"""

from ..training import faults, vllm_kernel

# Relative rounding tolerance of the logits in each dtype: bfloat16 keeps 8 significant bits (a rounding step is
# 2^-8 to 2^-7 of the value), float16 11; float32's kernels differ by far more than its own step (accumulation
# order), 1e-4 of the largest logit (about 1e-3 at the logits of a trained model).
ROUNDING = {"float32": 1e-4, "bfloat16": 2.0 ** -6, "float16": 2.0 ** -9}

# The order the filters apply in, which changes the distribution where top_p binds: transformers' generate()
# takes top-k, top-p, then min-p; vLLM takes min-p first (a logits processor), then top-k and top-p.
ORDERS = {"transformers": ("top_k", "top_p", "min_p"), "vllm": ("min_p", "top_k", "top_p")}
# Per position, the mean and variance of the score under each alternative (per_alternative's keys)
ALTERNATIVE_KEYS = ("shift", "variance", "outside", "changed")


class _Chain(list):
    """The warpers applied in turn, as transformers' LogitsProcessorList applies these ones (none takes more than
    the ids and the scores), without its signature inspection per call: a check scores thousands of small batches,
    where that inspection was an eighth of the time."""

    def __call__(self, input_ids, scores):
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


def processors(settings: dict, order: str = "transformers"):
    """transformers' own logits warpers for the settings: temperature, then the filters in `order` (ORDERS)."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    chain = _Chain()
    if settings.get("temperature") not in (None, 1.0):
        chain.append(TemperatureLogitsWarper(settings["temperature"]))
    make = {"top_k": lambda v: TopKLogitsWarper(v), "top_p": lambda v: TopPLogitsWarper(v),
            "min_p": lambda v: MinPLogitsWarper(v)}
    skip = {"top_k": (None, 0, -1), "top_p": (None, 1.0), "min_p": (None, 0, 0.0)}
    for key in ORDERS[order]:
        if settings.get(key) not in skip[key]:
            chain.append(make[key](settings[key]))
    return chain


def alternatives(settings: dict, margin: float) -> dict:
    """The samplers the check measures itself against: hotter and colder by `margin` (the score test's equivalence
    bounds), and each named sampling fault, as settings."""
    temperature = settings.get("temperature") or 1.0
    return {"hot": {**settings, "temperature": temperature * (1 + margin)},
            "cold": {**settings, "temperature": temperature * (1 - margin)},
            **{name: faults.sampler_settings(name, settings) for name in faults.SAMPLING}}


# Where the vocabulary is larger, a position is scored on its NARROW largest logits, the sampled token and the rest
# of the vocabulary as one token carrying its whole mass (at each sampler's temperature): exact wherever every
# sampler drops that rest, which the settings' top_k or min_p make the rule; a position where one keeps it is
# scored on the whole vocabulary. Every filter sorts what it is given: at Qwen3's 151,936 logits a position costs
# about 300 times as much.
NARROW = 512


def filtered(settings: dict, order: str, values, dummy=None):
    """`values` (rows of logits) through the settings' temperature and filters in `order`, and, for a sampler with
    drop_weakest's rule among its settings (faults.sampler_settings), vLLM 0.26's kernel's rule after them."""
    import torch

    dummy = torch.zeros((values.shape[0], 1), dtype=torch.long, device=values.device) if dummy is None else dummy
    kept = processors(settings, order)(dummy, values.clone())
    if settings.get(faults.RULE) != faults.DROP_WEAKEST:
        return kept
    candidates = processors({**settings, "top_p": None}, order)(dummy, values.clone())
    survivors = torch.isfinite(processors({**settings, "top_k": None, "top_p": None}, order)(dummy, values.clone()))
    return vllm_kernel.drop_weakest(candidates, kept, survivors.sum(-1), settings.get("top_k"), settings.get("top_p"))


def score_tokens(logits, tokens, settings: dict, *, rounding: float, margin: float,
                 order: str = "transformers") -> dict:
    """Per position of `logits` (T, V) as the scorer's model gives them for predicting `tokens` (T,): lists of
    log q(x), entropy H of q, variance of log q under q, outside (strict), outside_clear, decided, and per
    alternative (alternatives()) {shift, variance, outside, changed}."""
    import torch

    logits = logits.float()
    if logits.shape[-1] <= NARROW + 1:
        scored, _ = _score(logits, tokens, settings, rounding, margin, order, rest=None)
        return _as_lists(scored)
    top = logits.topk(NARROW + 1, dim=-1).indices
    among = top[:, :NARROW] == tokens[:, None]
    missing = ~among.any(-1)
    top[missing, NARROW] = tokens[missing]  # the sampled token is always a column of its own
    local = torch.where(missing, NARROW, among.int().argmax(-1))
    others = logits.scatter(1, top, -float("inf"))
    masses = {}

    def rest(chain_settings: dict):
        """The rest of the vocabulary as one logit: its mass at the settings' temperature in one token."""
        temperature = chain_settings.get("temperature") or 1.0
        if temperature not in masses:
            masses[temperature] = temperature * torch.logsumexp(others / temperature, dim=-1)
        return masses[temperature]

    scored, exact = _score(logits.gather(1, top), local, settings, rounding, margin, order, rest=rest)
    if not exact.all():
        rows = (~exact).nonzero().squeeze(1)
        full, _ = _score(logits[rows], tokens[rows], settings, rounding, margin, order, rest=None)
        _overwrite(scored, full, rows)
    return _as_lists(scored)


def _overwrite(into: dict, values: dict, rows) -> None:
    for key, value in values.items():
        if isinstance(value, dict):
            _overwrite(into[key], value, rows)
        else:
            into[key][rows] = value


def _as_lists(scored: dict) -> dict:
    return {key: _as_lists(value) if isinstance(value, dict) else value.tolist() for key, value in scored.items()}


def _score(logits, tokens, settings: dict, rounding: float, margin: float, order: str, rest,
           settings_only: bool = False):
    """score_tokens' quantities as tensors, and per position whether they are exact: with `rest` (a function of
    a sampler's settings) the logits are a narrowed set and every sampler's filters also see the rest of the vocabulary
    as one more token; a position is exact unless some filter keeps that token (`settings_only`: unless the
    settings' own filters keep it; the alternatives' figures there are then approximate)."""
    import torch

    rows = torch.arange(len(tokens), device=logits.device)
    dummy = torch.zeros((logits.shape[0], 1), dtype=torch.long, device=logits.device)
    exact = torch.ones(len(tokens), dtype=torch.bool, device=logits.device)

    def apply(chain_settings: dict, *values, temperatures=None):
        """The settings' filters on each of `values` (copies), each at its own temperature (default the settings'),
        with the rest of the vocabulary beside them if narrowed: in one pass over them stacked, as every filter works
        row by row. Each is divided by its temperature here, as transformers' TemperatureLogitsWarper divides, so that
        samplers that differ only in temperature are filtered together."""
        nonlocal exact
        temperatures = temperatures or [chain_settings.get("temperature")] * len(values)
        parts = []
        for part, temperature in zip(values, temperatures, strict=True):
            if rest is not None:
                part = torch.cat([part, rest({**chain_settings, "temperature": temperature})[:, None]], -1)
            parts.append(part if temperature in (None, 1.0) else part / temperature)
        stacked = torch.cat(parts) if len(parts) > 1 else parts[0]
        kept = filtered({**chain_settings, "temperature": None}, order, stacked, dummy.repeat(len(parts), 1))
        if rest is None:
            return kept.split(len(tokens))
        if not settings_only or chain_settings is settings:
            exact &= ~torch.isfinite(kept[:, -1]).view(len(parts), -1).any(0)
        return kept[:, :-1].split(len(tokens))

    (kept_logits,) = apply(settings, logits)
    logq = torch.log_softmax(kept_logits, dim=-1)
    keep = torch.isfinite(logq)
    finite = torch.where(keep, logq, torch.zeros_like(logq))
    q = logq.exp()
    entropy = -(q * finite).sum(-1)
    variance = ((q * finite ** 2).sum(-1) - entropy ** 2).clamp_min(0.0)
    picked = logq[rows, tokens]
    band = rounding * logits.amax(-1).abs().clamp_min(1.0)
    dropped = ~keep
    # Four probes of the support, filtered in one pass: the drawn token raised by the band (with a tie at top_k,
    # raising a token can push it out of top_p's nucleus), the weakest kept token lowered and the strongest dropped
    # one lifted by it (the boundary moved by the band), and every dropped token raised together (each raised on its
    # own, approximated at once)
    raised = logits.clone()
    raised[rows, tokens] += band
    weakest = torch.where(keep, logits, torch.full_like(logits, float("inf"))).argmin(-1)
    lowered = logits.clone()
    lowered[rows, weakest] -= band
    strongest = torch.where(dropped, logits, torch.full_like(logits, -float("inf"))).argmax(-1)
    lifted = logits.clone()
    lifted[rows, strongest] += band
    probes = apply(settings, raised, lowered, lifted, torch.where(keep, logits - band[:, None], logits))
    kept_raised, kept_lowered, kept_lifted, kept_others = (torch.isfinite(probe) for probe in probes)
    # outside, and still outside raised
    clear = ~keep[rows, tokens] & ~kept_raised[rows, tokens]
    # decided: the boundary tokens moved by the band leave the support as it is
    decided = (kept_lowered == keep).all(-1)
    decided &= (kept_lifted == keep).all(-1) | ~dropped.any(-1)
    if rest is not None:
        # the strongest token dropped must be one of the narrowed set: the rest holds none above it
        exact &= dropped.any(-1)
    # tokens clearly outside
    clear_all = dropped & ~kept_others
    centred = finite + entropy[:, None]
    out = {"logq": picked, "entropy": entropy, "variance": variance, "outside": ~torch.isfinite(picked),
           "outside_clear": clear, "decided": decided}
    # The samplers measured against, by their filters and then their temperature: each filtered once (the hotter
    # margin and temperature_up are one), those differing only in temperature together
    others, groups = alternatives(settings, margin), {}
    for name, alternative in others.items():
        filters = tuple(sorted((k, v) for k, v in alternative.items() if k != "temperature"))
        groups.setdefault(filters, {}).setdefault(alternative.get("temperature"), []).append(name)
    drawn_from = {}
    for filters, by_temperature in groups.items():
        kept = apply(dict(filters), *[logits] * len(by_temperature), temperatures=list(by_temperature))
        for names, values in zip(by_temperature.values(), kept, strict=True):
            drawn_from.update(dict.fromkeys(names, torch.softmax(values, dim=-1)))
    for name in others:
        p = drawn_from[name]
        inside = p * keep
        mass = inside.sum(-1)
        conditional = inside / mass.clamp_min(1e-30)[:, None]
        shift = (conditional * centred).sum(-1)
        spread = ((conditional * centred ** 2).sum(-1) - shift ** 2).clamp_min(0.0)
        out[name] = {"shift": torch.where(decided, shift, torch.zeros_like(shift)),
                     "variance": torch.where(decided, spread, torch.zeros_like(shift)),
                     "outside": (p * clear_all).sum(-1), "changed": 0.5 * (p - q).abs().sum(-1)}
    return out, exact


def empty() -> dict:
    """score_tokens' result for no positions (a completion without tokens)."""
    return {**{key: [] for key in ("logq", "entropy", "variance", "outside", "outside_clear", "decided")},
            **{name: {key: [] for key in ALTERNATIVE_KEYS} for name in ("hot", "cold", *faults.SAMPLING)}}


def completion_sums(scored: dict) -> dict:
    """One completion's scored positions in the sums the tests need (the per-token values are not kept).

    score and variance: the centred score sum(log q(x) + H) and its variance under correct sampling, over the
    decided positions whose token is inside; hot/cold: the shift and variance the margin's samplers would give
    there; scored: those positions; decided: every decided position; outside, outside_clear: tokens outside the
    support, strictly and clearly."""
    n = len(scored["logq"])
    counted = _counted(scored)
    logq, entropy = map(scored["logq"].__getitem__, counted), map(scored["entropy"].__getitem__, counted)
    score = [q + h for q, h in zip(logq, entropy)]
    sums = {"tokens": n, "scored": len(counted), "decided": sum(scored["decided"]), "score": sum(score),
            "variance": _summed(scored["variance"], counted),
            "outside": sum(scored["outside"]), "outside_clear": sum(scored["outside_clear"])}
    for side in ("hot", "cold"):
        sums[f"{side}_shift"] = _summed(scored[side]["shift"], counted)
        sums[f"{side}_variance"] = _summed(scored[side]["variance"], counted)
    return sums


def effect_sums(scored: dict) -> dict:
    """What each named sampling fault would change at these positions, summed: the power computation's input."""
    counted = _counted(scored)
    return {name: {"shift": _summed(scored[name]["shift"], counted),
                   "variance": _summed(scored[name]["variance"], counted),
                   "outside": sum(scored[name]["outside"]), "changed": sum(scored[name]["changed"])}
            for name in faults.SAMPLING}


def _counted(scored: dict) -> list[int]:
    """The positions the score sums: decided, their token inside the support."""
    return [i for i, (decided, outside) in enumerate(zip(scored["decided"], scored["outside"]))
            if decided and not outside]


def _summed(values: list, positions: list[int]):
    """values at positions, summed in their order (a check's thousands of completions make this the sums' cost)."""
    return sum(map(values.__getitem__, positions))
