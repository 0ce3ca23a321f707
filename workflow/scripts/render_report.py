"""Rule render_report: the equivalence report from the summaries, comparisons, statistics files and figures."""

import json
import os
from pathlib import Path

from grpo_equivalence.analysis import runs, stats
from grpo_equivalence.checks import rollout
from grpo_equivalence.report import render, sections
from grpo_equivalence.runtime import jobs

a = jobs.arguments()
out = Path(a["out"])
figures = {"curves": {int(steps): os.path.relpath(path, out.parent) for steps, path in a["curves"].items()},
           "speed": os.path.relpath(a["speed"], out.parent)}
text = render.render(summaries=[json.loads(Path(p).read_text()) for p in a["summaries"]],
                     comparisons=[json.loads(Path(p).read_text()) for p in a["comparisons"]],
                     reference=a["reference"], runs=runs.load_runs(a["stats"]), figures=figures,
                     alpha=a["verdict"]["alpha"], margin=a["verdict"]["margin"],
                     margins=a["verdict"].get("margins"),
                     rollout=sections.rollout_section([rollout.load(p) for p in a["rollout"]], a["reference"],
                                                    alpha=a["verdict"]["alpha"], settings=a["rollout_check"]),
                     trainer=sections.trainer_section([json.loads(Path(p).read_text()) for p in a.get("trainer", [])]))
stats.write_text(out, text)
edited = [str(p) for p in a["stats"] if stats.edited(p)]
notes = out.with_name(render.NOTES)
if edited:  # on the console too, at the workflow's end (the Snakefile's onsuccess prints it)
    stats.write_text(notes, "".join(f"{p} was edited after its train job wrote it: the report's verdicts use it as it "
                                    f"is now (named in the report)\n" for p in edited))
elif notes.exists():
    notes.unlink()
