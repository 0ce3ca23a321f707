"""Rule summarise: one run's train wall, median step after warm-up, start-up and memory."""

from grpo_equivalence.analysis import stats
from grpo_equivalence.analysis.summary import summarise
from grpo_equivalence.runtime import jobs

a = jobs.arguments()
stats.write_text(a["out"], stats.to_json(summarise(stats.load(a["stats"]), a["skip"])))
