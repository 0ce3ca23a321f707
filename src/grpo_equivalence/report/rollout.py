"""The report's rollout-check section: every backend's check judged together (rollout_verdict), what the check
can detect at the study's settings, and each backend's own figures."""

from pathlib import Path

from ..analysis import stats as stats_io
from ..analysis import verdict
from ..checks import power, rollout_scoring, rollout_verdict
from ..checks import rollout as rollout_files
from ..study.config import rollout_check_settings
from ..training import faults


def rollout_section(checks: list[dict], reference: str, *, alpha: float = verdict.ALPHA, settings: dict | None = None) -> dict | None:
    """The rollout check's verdicts: every candidate's file against the reference's at the study's seed, the
    reference at another seed against it (the control), and the reference's own sampler on its own logits where it
    reported them, judged together (rollout_verdict). None: no checks."""
    if not checks:
        return None
    settings = rollout_check_settings(settings)
    references = sorted((c for c in checks if c["backend"] == reference), key=lambda c: c["seed"])
    if not references:
        raise stats_io.StatsError(f"no rollout check of the reference {reference!r}; backends checked: "
                                  f"{sorted({c['backend'] for c in checks})}")
    base = references[0]
    others = sorted((c for c in checks if c["backend"] != reference), key=lambda c: c["backend"]) + references[1:]
    comparisons = [rollout_verdict.compare(base, other, alpha=alpha, support_margin=settings["support_margin"],
                                           margin_sd=settings["margin"], numerics_bound=settings["numerics_bound"])
                   for other in others]
    for comparison, other in zip(comparisons, others, strict=True):
        comparison["control"] = other["backend"] == reference
        comparison["label"] = f"{reference} (seed {other['seed']})" if comparison["control"] else other["backend"]
    if base.get("sampler_logits"):
        own = rollout_verdict.own_check(base, alpha=alpha, support_margin=settings["support_margin"])
        comparisons.insert(0, {**own, "control": False, "label": f"{reference} (reference)"})
    rollout_verdict.finalize(comparisons, alpha)
    for comparison in comparisons:
        comparison["sampler_said"], comparison["numerics_said"] = sampler_said(comparison), numerics_said(comparison)
    tokens = sum(x["tokens"] for x in base["completions"])
    one_sample = bool(base.get("sampler_logits"))
    return {"power": power.statements(base["own_profile"] if one_sample else base["profile"], tokens, alpha=alpha,
                                      family=comparisons[0]["family_size"], one_sample=one_sample,
                                      paired=power.paired_rates(base["completions"], settings["margin"])),
            "one_sample": one_sample, "power_tokens": tokens, "rounds": base["rounds"], "max_rounds": base["max_rounds"],
            "dtype": base["dtype"], "faults": faults.FAULTS, "reference": reference, "reference_seed": base["seed"],
            "comparisons": comparisons, "tests": rollout_verdict.TESTS, "settings": settings,
            "sampling": base["sampling"], "prompts": base["prompts"], "generations": base["generations"],
            "tolerance": base["tolerance"], "temperature_margin": base["temperature_margin"],
            "order": base.get("order", "transformers"),
            "numerics_bound": settings["numerics_bound"] if settings["numerics_bound"] is not None else
            rollout_verdict.NUMERICS_BOUND,
            # backends judged with the trainer's logits (they report none of their sampler's): their sampler's order
            # matters where it is not the one scored
            "other_order": sorted({c["backend"]: c["sampler_order"] for c in [base, *others]
                                   if not c.get("sampler_logits") and
                                   c.get("sampler_order") not in (None, base.get("order", "transformers"))}.items()),
            "unreported": sorted({c["backend"] for c in [base, *others] if not c.get("sampler_logits")}),
            "own": [{"backend": c["backend"], "seed": c["seed"], "tokens": sum(x["tokens"] for x in c["completions"]),
                     "sample_s": c.get("sample_s"), "mismatch": c.get("mismatch"), "numerics": c.get("numerics"),
                     "sampler_logits": c.get("sampler_logits")}
                    for c in [base, *others]],
            "drops_choices": drops_choices([base, *others]), "sampler_sure": rollout_scoring.SAMPLER_SURE,
            "settings_unsure": rollout_scoring.SETTINGS_UNSURE}


WORDS = {verdict.EQUIVALENT: "correct", verdict.DIVERGENT: "**divergent**", verdict.INCONCLUSIVE: "open"}


def sampler_said(comparison: dict) -> str:
    """What the rollout check says of a backend's sampler, in a few words: correct, divergent (which test, what it
    found) or open, and on what logits."""
    tests = comparison["tests"]
    support, score = tests["support"], tests["score"]
    own = support.get("exact", False)
    verdicts = [t["verdict"] for t in (support, score) if t["verdict"] != rollout_verdict.NO_VARIATION]
    word = (verdict.DIVERGENT if verdict.DIVERGENT in verdicts else verdict.EQUIVALENT
            if verdicts and set(verdicts) == {verdict.EQUIVALENT} else verdict.INCONCLUSIVE)
    found = []
    if support["verdict"] == verdict.DIVERGENT:
        found.append(f"{support['candidate_outside']} token(s) drawn outside the settings' support"
                     + ("" if own else " beyond the rounding, against the reference's"))
    if score["verdict"] == verdict.DIVERGENT:
        side = "too hot or drawn from another distribution" if score["difference"] < 0 else "too cold or keeping " \
                                                                                             "fewer tokens"
        found.append(f"score {'z' if own else 'difference z'} {score['z']:+.1f} ({side})")
    if score["verdict"] == rollout_verdict.NO_VARIATION and word != verdict.DIVERGENT:
        word = verdict.INCONCLUSIVE  # the score is what sees a temperature: without it nothing is confirmed
        found.append("no position where the settings leave a choice" + ("" if own else " the rounding does not decide"))
    basis = "on its own logits" if own else "scored with the trainer's logits, against the reference's"
    return f"{WORDS[word]} ({'; '.join(found + [basis])})"


def numerics_said(comparison: dict) -> str:
    """The numerics in a few words: the backend's mismatch against the reference's, with the test's verdict."""
    test = comparison["tests"].get("numerics")
    own = (comparison.get("numerics") or {}).get("candidate")
    if comparison.get("self"):
        return f"mismatch {own['mean_abs_logp_diff']:.4g} (the reference's)" if own else "not reported"
    if test is None or test["verdict"] == rollout_verdict.NOT_REPORTED:
        return f"not reported ({test['reason']})" if test else "not reported"
    ratio = test.get("ratio_to_reference")
    times = f"{ratio:.1f}x the reference's mismatch" if ratio is not None else "the reference's mismatch 0"
    where = ("**beyond the bound**" if test["verdict"] == verdict.DIVERGENT else "within the bound"
             if test["verdict"] == verdict.EQUIVALENT else "at the bound, undecided")
    return (f"{times} ({test['candidate_mean']:.3g} against {test['reference_mean']:.3g} a token; {where} "
            f"{test['bound']:.3g})")


# A check whose sampler was sure of its draw at this share of the positions where the settings leave a choice (and at
# SURE_COUNT of them at least) is named in the report: a correct sampler is almost never sure there
# (rollout_scoring.SAMPLER_SURE); a handful can be the rounding of two kernels at a cold temperature
SURE_SHARE, SURE_COUNT = 0.01, 5


def drops_choices(checks: list[dict]) -> list[dict]:
    """The checks whose sampler, by its own log-probabilities, kept only the token it drew where the settings keep
    others, at SURE_SHARE of those positions or more (and SURE_COUNT): the backend, its seed and the counts."""
    named = []
    for check in checks:
        mismatch = check.get("mismatch") or {}
        sure, unsure = mismatch.get("sampler_sure"), mismatch.get("unsure_positions")
        if sure is not None and unsure and sure >= max(SURE_COUNT, SURE_SHARE * unsure):
            named.append({"backend": check["backend"], "seed": check["seed"], "sure": sure, "positions": unsure})
    return named


def rollout_from_dir(folder: Path, reference: str, *, alpha: float = verdict.ALPHA, settings: dict | None = None) -> dict:
    """rollout_section of the rollout-check files in `folder` (<backend>[_seed<seed>].json, or .json.gz)."""
    paths = sorted([*Path(folder).glob("*.json"), *Path(folder).glob("*.json.gz")])
    if not paths:
        raise FileNotFoundError(f"no rollout-check files (<backend>.json, or .json.gz) in {folder}")
    return rollout_section([rollout_files.load(p) for p in paths], reference, alpha=alpha, settings=settings)
