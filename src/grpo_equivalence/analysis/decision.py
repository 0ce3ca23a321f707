"""One decision per candidate, from all its evidence: may a user switch from the reference to it and train the same?

- **trains differently**: a training metric is divergent (its effect and interval named, whatever metric it is), or
  the trainer check finds its step parting from the reference's, or its sampler samples otherwise than the
  reference's (judged against the reference's draws, or on its own logits where the reference's own sampler was
  shown correct), or its numerics lie beyond the bound a float8 rollout crosses (a defect, not a property).
- **trains as the reference**: none of that, and every headline metric (verdict.HEADLINE) equivalent at every step
  count judged: the runs rule out a change beyond what each interval says.
- **not decided**: otherwise; the open headline metrics with what their runs already rule out, and what would decide
  them (advice).

A sampler that samples wrong on its own logits while the reference's own sampler is not known to be right (a
reference that reports no logits of its sampler) does not decide by itself: both may share the defect (vLLM's top-p
kernel, in `vllm` and `trl_vllm` alike); it is said beside the decision. The numerics are a measured property, said as
a ratio to the reference's mismatch, and decide only beyond the fault bound."""

from . import advice as advising
from . import effects, verdict

SAME, DIFFERENT, OPEN = "trains as the reference", "trains differently", "not decided"


def sampler_state(rollout: dict | None) -> dict | None:
    """The rollout check's sampler: wrong, correct or open, and on what logits (None: not checked)."""
    if not rollout:
        return None
    tests = rollout["tests"]
    # "no variation": checks.rollout_verdict.NO_VARIATION (a later part of the package than this one)
    judged = [tests[n]["verdict"] for n in ("support", "score") if tests[n]["verdict"] != "no variation"]
    state = ("wrong" if verdict.DIVERGENT in judged else "correct" if judged and tests["score"]["verdict"] ==
             verdict.EQUIVALENT and set(judged) == {verdict.EQUIVALENT} else "open")
    return {"state": state, "own_logits": bool(tests["support"].get("exact")), "said": rollout.get("sampler_said")}


def numerics_state(rollout: dict | None) -> dict | None:
    """The numerics: the candidate's mismatch over the reference's, and whether it lies beyond the fault bound."""
    test = (rollout or {}).get("tests", {}).get("numerics")
    if not test or test.get("not_reported") or test.get("candidate_mean") is None:
        return None
    ref = test.get("reference_mean")
    return {"ratio": test["candidate_mean"] / ref if ref else None, "mismatch": test["candidate_mean"],
            "reference": ref, "bound": test.get("bound"), "beyond": test.get("verdict") == verdict.DIVERGENT}


def decide(candidate: str, reference: str, pairs: list[dict], *, rollout: dict | None = None,
           trainer: dict | None = None, reference_sampler_correct: bool = False,
           costs: dict | None = None) -> dict:
    """The decision on `candidate` from its comparisons with the reference (`pairs`: one per step count, as compare
    returns them, finalized), its rollout-check comparison, its trainer-check row ({"first": stage or None}), whether
    the reference's own sampler was shown correct, and the device time of one run of each backend per step count
    (`costs`: {steps: (reference's, candidate's)}) for the advice."""
    sampler, numerics = sampler_state(rollout), numerics_state(rollout)
    found, reasons, open_cells = [], [], []
    for pair in pairs:
        steps = pair["max_steps"]
        for metric, entry in [*pair["metrics"].items(),
                              *((f"rewards/{n}/mean", e) for n, e in pair.get("reward_functions", {}).items())]:
            result = entry["verdict"]
            effect = result.get("effect")
            cell = {"steps": steps, "metric": metric, "verdict": result["verdict"], "effect": effect,
                    "effect_said": effects.words(effect) if effect else None, "ruled_out": effects.ruled_out(effect),
                    "headline": metric in verdict.HEADLINE}
            if result["verdict"] == verdict.INCONCLUSIVE and cell["headline"]:
                cost = (costs or {}).get(steps, (None, None))
                cell["advice"] = advising.advise(metric, result, reference_cost=cost[0], candidate_cost=cost[1])
                cell["advice_said"] = advising.words(cell["advice"])
                open_cells.append(cell)
            found.append(cell)
            if result["verdict"] == verdict.DIVERGENT:
                reasons.append(f"{metric} {cell['effect_said']} at {steps} steps")
    relative = sampler and sampler["state"] == "wrong" and (not sampler["own_logits"] or reference_sampler_correct)
    if relative:
        reasons.append(f"sampler {sampler['said']}")
    if trainer and trainer.get("first"):
        reasons.append(f"its trainer's step parts from {reference}'s at the {trainer['first']}")
    if numerics and numerics["beyond"]:
        reasons.append(f"numerics beyond the float8 rollout's bound (mismatch {numerics['mismatch']:.3g}, the bound "
                       f"{numerics['bound']:.3g})")
    headline = [c for c in found if c["headline"]]
    if reasons:
        decision = DIFFERENT
    elif headline and all(c["verdict"] == verdict.EQUIVALENT for c in headline):
        decision = SAME
    else:
        decision = OPEN
    return {"candidate": candidate, "reference": reference, "decision": decision, "reasons": reasons,
            "cells": found, "open": open_cells, "sampler": sampler, "numerics": numerics,
            "trainer": None if trainer is None else (trainer.get("first") or "same step"),
            "caveats": _caveats(sampler, numerics, relative, reference)}


def _caveats(sampler: dict | None, numerics: dict | None, relative: bool, reference: str) -> list[str]:
    said = []
    if sampler and sampler["state"] == "wrong" and not relative:
        said.append(f"its sampler samples otherwise than the settings say ({sampler['said']}); {reference}'s own "
                    f"sampler was not shown right, so both may share it")
    if numerics and not numerics["beyond"] and numerics["ratio"] is not None:
        said.append(f"numerics {numerics['ratio']:.1f}x {reference}'s mismatch ({numerics['mismatch']:.2g} against "
                    f"{numerics['reference']:.2g} a token): a property of its kernels, within the float8 rollout's "
                    f"bound")
    return said


def words(found: dict) -> str:
    """The decision in a sentence a user acts on."""
    reference = found["reference"]
    if found["decision"] == DIFFERENT:
        return f"**trains differently** from {reference}: " + "; ".join(found["reasons"])
    headline = [c for c in found["cells"] if c["headline"]]
    if found["decision"] == SAME:
        parts = [f"sampler {found['sampler']['state']}" if found["sampler"] else "sampler not checked",
                 "the same step" if found["trainer"] == "same step" else "trainer not checked"
                 if found["trainer"] is None else f"trainer {found['trainer']}"]
        ruled = [f"{c['metric']} {c['effect_said']}" for c in headline]
        return f"**trains as {reference}**: " + ", ".join(parts) + "; the runs: " + "; ".join(ruled)
    opened = []
    for cell in found["open"]:
        text = f"{cell['metric']} {cell['effect_said'] or 'no interval yet'}"
        if cell["ruled_out"]:
            text += f", ruling out {cell['ruled_out']}"
        opened.append(text)
    return "**not decided**: " + ("; ".join(opened) if opened else "no headline metric judged")
