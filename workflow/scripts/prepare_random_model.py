"""Rule prepare_random_model: a real architecture with random weights and a tokenizer of its vocabulary's size."""

import time
from pathlib import Path

from grpo_equivalence.runtime import jobs
from grpo_equivalence.training import random_model

a = jobs.arguments()
jobs.stop_with_workflow()
start = time.perf_counter()
spec = a["random_model"]
count = random_model.save(a["architecture"], Path(a["out"]), tokenizer_size=spec["tokenizer_size"], dtype=a["dtype"],
                          seed=spec["seed"])
print(f"{spec['architecture']}: {count / 1e9:.3f}B parameters, random ({a['dtype']}, seed {spec['seed']}) -> {a['out']} "
      f"in {time.perf_counter() - start:.0f} s")
