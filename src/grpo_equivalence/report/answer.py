"""The report's opening: per candidate, in a few words, what is equivalent, what differs and where (the rollout
check, the trainer check, the runs), what to run next to decide what is open, whether its runs are the reference's
to the bit, and its speed with the spread over the runs that measured it."""

import statistics

from ..analysis import advice, decision, verdict
from ..analysis.summary import step_speed

WORD = {verdict.EQUIVALENT: "equivalent", verdict.DIVERGENT: "**divergent**", verdict.INCONCLUSIVE: "open"}


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
    """One row per candidate: its rollout check, its trainer check, per step count the headline verdicts and what
    the next look needs, identical runs, and its speed against the reference's."""
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
        row = {"candidate": name, "rollout": None, "trainer": None, "steps": [], "identical": [], "speed": [],
               "decision": decided, "decision_said": decision.words(decided)}
        if name in rollout_by:
            c = rollout_by[name]
            row["rollout"] = {"verdict": c["verdict"], "sampler": c.get("sampler_said"), "numerics": c.get("numerics_said")}
        if name in trainer_by:
            t = trainer_by[name]
            row["trainer"] = f"parts at {t['first']}" if t["first"] else "computes the same step"
        for table in tables:
            pair = next((p for p in table["pairs"] if p["candidate"] == name), None)
            if pair is None:
                continue
            headline = {m: pair["metrics"][m]["verdict"] for m in verdict.HEADLINE if m in pair["metrics"]}
            said = [f"{m} {WORD.get(v['verdict'], v['verdict'])}" for m, v in headline.items()]
            nexts = [v.get("next_runs") for v in headline.values() if v["verdict"] == verdict.INCONCLUSIVE and
                     v.get("next_runs")]
            runs = groups.get((name, table["steps"]), [])
            reference_runs = groups.get((reference, table["steps"]), [])
            row["steps"].append({"steps": table["steps"], "said": ", ".join(said), "runs": len(runs),
                                 "next_runs": min(nexts) if nexts else None})
            if identical(reference_runs, runs, verdict.HEADLINE):
                row["identical"].append(table["steps"])
            mine = step_speed(runs, skip, step_speed(reference_runs, skip))
            if mine:
                row["speed"].append({"steps": table["steps"], **mine})
        out.append(row)
    return out
