"""Every output path of the workflow, defined once (the Snakefile's rules and the CLIs import these)."""

STATS = "results/stats/grpo_{backend}_{steps}.json"
SUMMARY = "results/stats/grpo_{backend}_{steps}.summary.json"
COMPARISON = "results/compare/{candidate}_vs_{reference}_{steps}.json"
REPORT = "results/grpo_equivalence.md"
TINY_MODEL = "results/tiny/model"
TINY_DATA = "results/tiny/data/train.jsonl"
PRIMED_MODEL = "results/tiny/primed"
LOG = "results/logs/{name}.log"  # one log per job, name given by the rule
RUN_CACHE = "results/cache/runs"  # finished runs by content key (runcache): never trained twice
