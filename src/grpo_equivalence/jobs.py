"""The workflow's jobs: `python -m grpo_equivalence.jobs STAGE SETTINGS_JSON IO_JSON`, one stage per rule.

SETTINGS are what the job's result depends on (a change reruns it: Snakemake compares them); IO are
the paths and thread count it runs with (Snakemake does not compare params derived from paths).

Rules call these through `shell:` rather than `script:` because Snakemake reruns a script job when the
script file's timestamp changes, which a fresh clone changes for every file; a shell command is compared
by its text, and each rule's `code` param (see codedeps) by content. This module only unpacks arguments
and calls the library, so its own edits do not rerun jobs; what a job computes lives in the modules
named in the rule's code hash.
"""

import json
import sys
from pathlib import Path


def prepare_model(a):
    from . import tiny

    t = a["tiny"]
    tiny.save_model(Path(a["out"]), hidden_size=t["hidden_size"], num_layers=t["num_layers"], seed=t["seed"])


def prepare_data(a):
    from . import tiny

    t = a["tiny"]
    rows = tiny.problems(t["problems"], t["max_operand"], t["seed"])
    tiny.save_problems(Path(a["out"]), rows)
    print(f"{len(rows)} problems -> {a['out']}")


def prime(a):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import prime as priming

    torch.set_num_threads(a["threads"])
    t = a["tiny"]
    model = AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(a["model"])
    rows = [json.loads(line) for line in Path(a["data"]).read_text().splitlines()]
    priming.prime(model, tokenizer, rows, system_prompt=a["system_prompt"], steps=t["prime_steps"],
                  batch_size=t["prime_batch_size"], learning_rate=t["prime_learning_rate"], seed=t["seed"])
    # Saved in the study's dtype, as a real checkpoint is: an engine that loads the model from its path
    # (TRL's vLLM takes the checkpoint's dtype) then runs in the dtype the trainer trains in.
    model.to(getattr(torch, a["dtype"])).save_pretrained(a["out"])
    tokenizer.save_pretrained(a["out"])


def train(a):
    from . import gpus, train as training

    config = a["config"]
    training.check_packages(a["backend"])  # before waiting for a GPU: a missing package fails at once
    with gpus.leased(config["gpus_per_train_job"]) as lease:
        import torch

        torch.set_num_threads(a["threads"])
        training.run(config, a["backend"], a["steps"], model_path=a["model_path"], dataset=a["dataset"],
                     out=Path(a["out"]), gpu_lease=lease.record())


def summarise(a):
    from . import stats
    from .summary import summarise as summary_of

    Path(a["out"]).write_text(json.dumps(summary_of(stats.load(a["stats"]), a["skip"]), indent=1) + "\n")


def compare(a):
    from . import stats
    from .compare import compare as compared

    result = compared(stats.load(a["reference"]), stats.load(a["candidate"]))
    Path(a["out"]).write_text(json.dumps(result, indent=1) + "\n")


def render_report(a):
    from . import report, stats

    def read(paths):
        return [json.loads(Path(p).read_text()) for p in paths]

    text = report.render(summaries=read(a["summaries"]), comparisons=read(a["comparisons"]), reference=a["reference"],
                         runs=[stats.load(p) for p in a["stats"]], stats_files=a["stats"])
    Path(a["out"]).write_text(text)


STAGES = {f.__name__: f for f in (prepare_model, prepare_data, prime, train, summarise, compare, render_report)}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] not in STAGES:
        sys.exit(f"usage: python -m grpo_equivalence.jobs {{{','.join(STAGES)}}} SETTINGS_JSON IO_JSON")
    STAGES[argv[0]]({**json.loads(argv[1]), **json.loads(argv[2])})


if __name__ == "__main__":
    main()
