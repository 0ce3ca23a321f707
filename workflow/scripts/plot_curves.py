"""Rule plot_curves: the per-step curves of every backend at one step count, the reference's seeds shaded."""

from pathlib import Path

from grpo_equivalence.analysis import runs
from grpo_equivalence.report import plots
from grpo_equivalence.runtime import jobs

a = jobs.arguments()
groups = runs.group_runs(runs.load_runs(a["stats"]))
plots.curves({backend: group for (backend, _), group in groups.items()}, a["reference"], Path(a["out"]))
