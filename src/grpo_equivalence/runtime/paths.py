"""Every output path of the workflow, and where the project's own files lie, defined once (the Snakefile's rules
and the CLIs import these)."""

from pathlib import Path

# The project's folder (src/grpo_equivalence/runtime/ is three levels below it): its schema and report templates
PROJECT = Path(__file__).resolve().parents[3]
SCHEMA = PROJECT / "workflow" / "schemas" / "config.schema.yaml"
TEMPLATES = PROJECT / "report_templates"  # the report's Jinja template and the sections it includes

STATS = "results/stats/grpo_{backend}_{steps}.json"  # the run with the study's seed
# A run reseeded to measure the noise floor (seed+1, seed+2, ...), beside the others
REPLICATE_STATS = "results/stats/grpo_{backend}_{steps}_seed{seed}.json"
# Either of the two, as the train rule's output: {replicate} is "" or "_seed<seed>"
RUN_STATS = "results/stats/grpo_{backend}_{steps}{replicate}.json"
# The rollout check at fixed weights of one backend ({replicate}: "" for the study's seed, "_seed<seed>" for the
# reference's second seed, its control)
ROLLOUT = "results/rollout/{backend}{replicate}.json"
SUMMARY = "results/stats/grpo_{backend}_{steps}.summary.json"
COMPARISON = "results/compare/{candidate}_vs_{reference}_{steps}.json"
REPORT = "results/grpo_equivalence.md"
CURVES_FIGURE = "results/figures/curves_{steps}.png"  # per-step curves of every backend, one step count
SPEED_FIGURE = "results/figures/speed_memory.png"  # median step and peak memory of every run
TINY_MODEL = "results/tiny/model"
TINY_DATA = "results/tiny/data/train.jsonl"
PRIMED_MODEL = "results/tiny/primed"
RANDOM_MODEL = "results/random/model"  # a real architecture with random weights (model: random)
LOG = "results/logs/{name}.log"  # one log per job, name given by the rule
TRAIN_LOG = "train/{backend}_{steps}{replicate}"  # a train job's log name (LOG's {name})
JOB_ARGS = ".snakemake/grpo-equivalence/args"  # each job's settings and io, a file per content (jobs.args_file)
JOB_SERVER_LOG = "results/logs/jobserver.log"  # the job server of a local CPU study (runtime.jobserver)
BENCHMARK = "results/benchmarks/{name}.tsv"  # Snakemake's own wall time and memory of a job, name given by the rule
ADAPTER = "results/adapters/{backend}_{steps}{replicate}"  # a run's trained adapter (save_adapters)
RUN_CACHE = "results/cache/runs"  # finished runs by content key (runcache): never trained twice
