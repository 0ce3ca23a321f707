"""Rule trainer_compare: a backend's trainer check against the reference's, judged against the reference's own
precision change (grpo_equivalence.checks.trainer_verdict)."""

import json
from pathlib import Path

import torch

from grpo_equivalence.analysis import stats
from grpo_equivalence.checks import trainer_verdict
from grpo_equivalence.runtime import jobs

a = jobs.arguments()
pairs = {role: (json.loads(Path(a[role][0]).read_text()), torch.load(a[role][1])) for role in
         ("reference", "candidate", "control")}
stats.write_json(Path(a["out"]), trainer_verdict.compare(pairs["reference"], pairs["candidate"], pairs["control"]))
