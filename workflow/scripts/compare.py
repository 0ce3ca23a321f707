"""Rule compare: a candidate's runs against the reference's at one step count: step by step, against the
reference's seed-to-seed noise floor, with a verdict per metric."""

from grpo_equivalence.analysis import stats
from grpo_equivalence.analysis.compare import compare
from grpo_equivalence.runtime import jobs

a = jobs.arguments()
reference, candidate = ([stats.load(p) for p in a[role]] for role in ("reference", "candidate"))
stats.write_text(a["out"], stats.to_json(compare(reference, candidate, alpha=a["alpha"], margin=a["margin"],
                                                            margins=a.get("margins"))))
