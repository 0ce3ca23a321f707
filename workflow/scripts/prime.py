"""Rule prime: a short supervised pass so that the tiny model writes the answer format (see prime.py)."""

from grpo_equivalence.runtime import jobs
from grpo_equivalence.training import prime

a = jobs.arguments()
jobs.stop_with_workflow()
t = a["tiny"]
prime.prime_saved(a["model"], a["data"], a["out"], system_prompt=a["system_prompt"], dtype=a["dtype"],
                  steps=t["prime_steps"], batch_size=t["prime_batch_size"], learning_rate=t["prime_learning_rate"],
                  seed=t["seed"])
