"""Rule render_report: the equivalence report from the summaries, comparisons and statistics files."""

import json
from pathlib import Path

from grpo_equivalence import jobs, report

a = jobs.arguments()
runs = report.load_runs(a["stats"])
text = report.render(summaries=[json.loads(Path(p).read_text()) for p in a["summaries"]],
                     comparisons=[json.loads(Path(p).read_text()) for p in a["comparisons"]],
                     reference=a["reference"], runs=list(runs.values()), stats_files=a["stats"])
Path(a["out"]).write_text(text)
