"""Every output path of the workflow, and where the project's own files lie, defined once (the Snakefile's rules
and the CLIs import these)."""

from pathlib import Path, PurePosixPath

# The project's folder (src/grpo_equivalence/runtime/ is three levels below it): its schema and report templates
PROJECT = Path(__file__).resolve().parents[3]
SCHEMA = PROJECT / "workflow" / "schemas" / "config.schema.yaml"
TEMPLATES = PROJECT / "report_templates"  # the report's Jinja template and the sections it includes

# Each study writes its own outputs to its results folder (`results` in the study, by default results/NAME):
# the templates of this first block are written for a study whose folder is `results`, and of_study puts them
# under another's.
RESULTS = "results"
STATS = "results/stats/grpo_{backend}_{steps}.json"  # the run with the study's seed
# A run reseeded to measure the noise floor (seed+1, seed+2, ...), beside the others
REPLICATE_STATS = "results/stats/grpo_{backend}_{steps}_seed{seed}.json"
# Either of the two, as the train rule's output: {replicate} is "" or "_seed<seed>"
RUN_STATS = "results/stats/grpo_{backend}_{steps}{replicate}.json"
# The rollout check at fixed weights of one backend ({replicate}: "" for the study's seed, "_seed<seed>" for the
# reference's second seed, its control)
ROLLOUT = "results/rollout/{backend}{replicate}.json"
# The trainer check at fixed weights on one batch (checks.trainer): the batch the reference samples, each backend's
# figures and tensors ({variant}: "" in the study's precision, "_control" for the reference in the other), and each
# backend's comparison with the reference
TRAINER_BATCH = "results/trainer/batch.json"
TRAINER_CHECK = "results/trainer/{backend}{variant}.json"
TRAINER_TENSORS = "results/trainer/{backend}{variant}.pt"
TRAINER_COMPARISON = "results/trainer/{candidate}_vs_{reference}.json"
SUMMARY = "results/stats/grpo_{backend}_{steps}.summary.json"
COMPARISON = "results/compare/{candidate}_vs_{reference}_{steps}.json"
REPORT = "results/grpo_equivalence.md"
HTML_REPORT = "results/report.html"  # Snakemake's --report of the study (make report)
CURVES_FIGURE = "results/figures/curves_{steps}.png"  # per-step curves of every backend, one step count
SPEED_FIGURE = "results/figures/speed_memory.png"  # median step and peak memory of every run
LOG = "results/logs/{name}.log"  # one log per job, name given by the rule
JOB_SERVER_LOG = "results/logs/jobserver.log"  # the job server of a local CPU study (runtime.jobserver)
BENCHMARK = "results/benchmarks/{name}.tsv"  # Snakemake's own wall time and memory of a job, name given by the rule
ADAPTER = "results/adapters/{backend}_{steps}{replicate}"  # a run's trained adapter (save_adapters)

# Shared by every study in the working directory: the built models, the run cache (a run one study finished is
# restored in another with the same settings), the trackers' folder (runs grouped by study), the jobs' settings.
TINY_MODEL = "results/tiny/model"
TINY_DATA = "results/tiny/data/train.jsonl"
PRIMED_MODEL = "results/tiny/primed"
RANDOM_MODEL = "results/random/model"  # a real architecture with random weights (model: random)
RUN_CACHE = "results/cache/runs"  # finished runs by content key (runcache): never trained twice
TRACKING = "results/tracking"  # what the trackers of grpo.report_to write, by study and run
# No study's own folder lies in these (results/tiny may hold the tiny study's outputs beside the built model)
SHARED = ("results/cache", TRACKING)
TRAIN_LOG = "train/{backend}_{steps}{replicate}"  # a train job's log name (LOG's {name})
JOB_ARGS = ".snakemake/grpo-equivalence/args"  # each job's settings and io, a file per content (jobs.args_file)

def of_study(template: str, folder: str) -> str:
    """A study's own output `template` (one written under `results` above) under the study's results folder."""
    relative = PurePosixPath(template).relative_to(RESULTS)
    return str(PurePosixPath(folder) / relative)
