"""Rule summarise: one run's train wall, median step after warm-up, start-up and memory."""

from grpo_equivalence import jobs, stats
from grpo_equivalence.summary import summarise

a = jobs.arguments()
stats.write_text(a["out"], stats.to_json(summarise(stats.load(a["stats"]), a["skip"])))
