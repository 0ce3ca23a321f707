"""The report's opening: per candidate its decision (analysis.decision: what differs and where, what is open and
what would decide it), its rollout and trainer checks, whether its runs are the reference's to the bit, and its speed
with the spread over the runs that measured it."""

from ..analysis import advice, decision, verdict
from ..analysis.summary import step_speed


def identical(reference_runs: list[dict], candidate_runs: list[dict], metrics) -> bool:
    """Whether the candidate's runs are the reference's of the same seeds, every logged metric at every step the
    same number (two names for one computation: their verdicts say nothing about a rollout)."""
    by_seed = {r["seed"]: r for r in reference_runs}
    pairs = [(by_seed[c["seed"]], c) for c in candidate_runs if c["seed"] in by_seed]
    if not pairs:
        return False
    keys = ("loss", "reward", "kl", "grad_norm")
    return all(len(r["steps"]) == len(c["steps"]) and all(
        a.get(k) == b.get(k) for a, b in zip(r["steps"], c["steps"], strict=True) for k in keys) for r, c in pairs)


def rows(tables: list[dict], groups: dict, reference: str, skip: int, rollout: dict | None,
         trainer: dict | None) -> list[dict]:
    """One row per candidate: its decision, its rollout check, its trainer check, the step counts where its runs are
    the reference's to the bit, and its speed against the reference's."""
    rollout_by = {c["label"]: c for c in (rollout or {}).get("comparisons", []) if not c.get("control")}
    trainer_by = {r["label"]: r for r in (trainer or {}).get("rows", []) if not r["control"]}
    own = rollout_by.get(f"{reference} (reference)")
    reference_correct = bool(own and decision.sampler_state(own)["state"] == "correct")
    candidates = sorted({p["candidate"] for t in tables for p in t["pairs"]})
    out = []
    for name in candidates:
        pairs = [p for t in tables for p in t["pairs"] if p["candidate"] == name]
        costs = {t["steps"]: (advice.run_cost(groups.get((reference, t["steps"]), [])),
                              advice.run_cost(groups.get((name, t["steps"]), []))) for t in tables}
        decided = decision.decide(name, reference, pairs, rollout=rollout_by.get(name), trainer=trainer_by.get(name),
                                  reference_sampler_correct=reference_correct, costs=costs)
        row = {"candidate": name, "rollout": None, "trainer": None, "identical": [], "speed": [],
               "decision": decided, "decision_said": decision.words(decided)}
        if name in rollout_by:
            c = rollout_by[name]
            row["rollout"] = {"verdict": c["verdict"], "sampler": c.get("sampler_said"), "numerics": c.get("numerics_said")}
        if name in trainer_by:
            t = trainer_by[name]
            row["trainer"] = f"parts at {t['first']}" if t["first"] else "computes the same step"
        for table in tables:
            if not any(p["candidate"] == name for p in table["pairs"]):
                continue
            runs = groups.get((name, table["steps"]), [])
            reference_runs = groups.get((reference, table["steps"]), [])
            if identical(reference_runs, runs, verdict.HEADLINE):
                row["identical"].append(table["steps"])
            mine = step_speed(runs, skip, step_speed(reference_runs, skip))
            if mine:
                row["speed"].append({"steps": table["steps"], **mine})
        out.append(row)
    return out
