"""What the benchmarks share (no benchmark imports another): the tiny study's model and data and the study a
fault benchmark checks, their options and tables, the tiny model's logits at sampled positions, and the cells a
report decides."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from grpo_equivalence.analysis import verdict  # noqa: E402

MODEL = ROOT / "results/tiny/primed"
DATA = ROOT / "results/tiny/data/train.jsonl"


SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")


def study(sampling: str = "tiny", dtype: str = "float32", gpu: bool = False, max_rounds: int = 1,
          margin: float | None = None, per_call: int | None = None, vllm_share: float | None = None,
          order: str | None = None, exact_top_p: bool = False) -> dict:
    """The tiny study, with config.yaml's sampling settings where `sampling` is "study"; `vllm_share`: the GPU
    memory fraction each vLLM engine reserves (several checks run at once); `exact_top_p`: the option of the
    backends that have it (trl_vllm: vLLM's sort-based top-k/top-p, not its kernel)."""
    import yaml

    from grpo_equivalence.study.config import rollout_check_settings

    config = yaml.safe_load((ROOT / "studies/tiny.yaml").read_text())
    if sampling == "study":
        real = yaml.safe_load((ROOT / "config.yaml").read_text())["grpo"]
        config["grpo"].update({key: real[key] for key in SAMPLING_KEYS})
    config.update(dtype=dtype, gpus_per_train_job=int(gpu))
    check = {**config.get("rollout_check", {}), "max_rounds": max_rounds}
    if margin is not None:
        check["temperature_margin"] = margin
    if order is not None:  # the filters' order the scorer applies: vLLM's for a backend that samples with vLLM
        check["order"] = order
    if per_call is not None:  # how many prompts one generation call takes: speed only, the sampling is the same
        check["prompts_per_call"] = per_call
    config["rollout_check"] = rollout_check_settings(check)
    # backend options the benchmark sets, each given to every backend that has it, beside the study's own
    wanted = {**({"gpu_memory_utilization": vllm_share} if vllm_share is not None else {}),
              **({"exact_top_p": True} if exact_top_p else {})}
    if wanted:
        from grpo_equivalence.training import backends

        options = dict(config.get("backend_options") or {})
        for name in backends.names():
            accepted = {key: value for key, value in wanted.items() if key in backends.get(name).options}
            if accepted:
                options[name] = {**options.get(name, {}), **accepted}
        config["backend_options"] = options
    return config


def quiet(message: str) -> None:
    """A check's progress lines, dropped: the benchmark prints one line per finished check."""


def build_tiny(jobs: int) -> None:
    """The tiny study's primed model and data, built by the workflow where results/tiny/ lacks them."""
    if not (MODEL.exists() and DATA.exists()):
        subprocess.run([sys.executable, "-m", "snakemake", str(MODEL.relative_to(ROOT)), str(DATA.relative_to(ROOT)),
                        "--cores", str(jobs), "--config", "study=studies/tiny.yaml"], cwd=ROOT, check=True)


def arguments(description: str, reps: int, out: str) -> argparse.ArgumentParser:
    """The options both fault benchmarks take."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--backend", default="hf")
    parser.add_argument("--out", default=out)
    parser.add_argument("--sampling", choices=("tiny", "study"), default="tiny",
                        help="the tiny study's sampling settings, or config.yaml's (the real study's)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--gpu", action="store_true", help="run on the GPU (every check or run shares it; TRL 1.15 "
                        "trains only there)")
    parser.add_argument("--max-rounds", type=int, default=1, help="the cap on each check's rounds")
    parser.add_argument("--first-seed", type=int, default=10_000, help="the first repetition's reference seed")
    parser.add_argument("--deadline", type=float, default=None, help="seconds after which the checks still running "
                        "are dropped and the whole repetitions finished are judged")
    parser.add_argument("--margin", type=float, default=None, help="the score test's temperature margin (default: "
                        "the study's)")
    return parser


def print_table(columns: tuple, what: str, names, counts: dict, divergent_by: dict, args) -> None:
    """Per candidate, the share of repetitions of each verdict and how often each test (metric) was divergent."""
    print(f"| Candidate | {' | '.join(columns)} | Divergent by {what} ({', '.join(names)}) |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, found in counts.items():
        share = {k: 100 * v / args.reps for k, v in found.items()}
        label = {"control": "reseeded reference (control)", "reference": "reference, its own sampler"}.get(
            name, f"{args.backend}+{name}")
        print(f"| {label} | {share[verdict.DIVERGENT]:.0f} % | {share[verdict.EQUIVALENT]:.0f} % | "
              f"{share[verdict.INCONCLUSIVE]:.0f} % | {', '.join(str(divergent_by[name][t]) for t in names)} |")


def prepare(args) -> None:
    """Offline, and the tiny study's model and data built."""
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if args.gpu:  # vLLM engines started at once are told their KV cache's size rather than measure the device
        from grpo_equivalence.runtime import quietlock

        os.environ[quietlock.SIZED_ENV] = "1"
    build_tiny(args.jobs)


def against_q(logits, settings: dict, drawn_from) -> dict:
    """A sampler drawing from softmax(`drawn_from`) (its processed logits, -inf where it drops a token), measured
    against q (transformers' order of `settings` on `logits`): its expected score and its mass outside q's support,
    averaged over the positions."""
    import torch

    from grpo_equivalence.checks import scoring

    ids = torch.zeros((len(logits), 1), dtype=torch.long)
    logq = torch.log_softmax(scoring.processors(settings, "transformers")(ids, logits.clone()), -1)
    p = torch.softmax(drawn_from, -1)
    kept = torch.isfinite(logq)
    entropy = -(logq.exp() * torch.where(kept, logq, 0.0)).sum(-1)
    score = (p * torch.where(kept, logq + entropy[:, None], 0.0)).sum(-1)
    return {"score": float(score.mean()), "outside": float((p * (~kept)).sum(-1).mean())}


def sampled_logits(sampling: str, prompts: int):
    """The study's sampling settings and the tiny model's float32 logits (CPU) at every position of the completions
    `hf` samples for the first `prompts` prompts of the tiny data, num_generations each."""
    import torch

    from grpo_equivalence.checks import rollout, rollout_scoring
    from grpo_equivalence.training.session import session

    prepare(argparse.Namespace(jobs=2, gpu=False))
    config = study(sampling=sampling)
    dataset = {"path": "json", "data_files": str(DATA), "name": None}
    with session(config, "hf", 1, model_path=str(MODEL), dataset=dataset, seed=1,
                 log=lambda message: None) as built:
        trainer = built.trainer
        rows = [trainer.train_dataset[i] for i in range(prompts)]
        output = trainer._generate([row["prompt"] for row in rows for _ in range(trainer.num_generations)])
        records = [{"prompt_ids": list(p), "completion_ids": list(c)} for p, c in zip(output[0], output[1],
                                                                                    strict=True) if len(c)]
        trainer.model.eval()
        with torch.no_grad():
            logits = torch.cat(rollout_scoring.forward_logits(trainer.model, records, torch.device("cpu"))).float()
    return {key: config["grpo"][key] for key in rollout.SAMPLING_KEYS}, logits


DECIDING = verdict.HEADLINE  # the cells a study is asked to decide
DECIDED = (verdict.EQUIVALENT, verdict.DIVERGENT)


def headline_cells(runs: dict, reference: str) -> list[tuple[str, str, int, dict]]:
    """(candidate, metric, steps, verdict) of every cell a study is asked to decide, judged as its report judges
    them, from its runs ({path: stats})."""
    from grpo_equivalence.analysis import runs as run_files
    from grpo_equivalence.report import render, sections

    judged = render.judged(runs, reference)
    tables = sections.step_tables(judged["summaries"], judged["comparisons"], run_files.group_runs(runs), reference)
    return [(pair["candidate"], metric, table["steps"], pair["metrics"][metric]["verdict"])
            for table in tables for pair in table["pairs"] for metric in DECIDING]


def paired_cells(stats_dir: str, reference: str) -> list[dict]:
    """Every candidate's every metric and reward function against the reference in a study's statistics files: the
    mean and SD of the paired differences of the run summaries (paired by seed) and the margin on the summary's
    scale (the study's defaults), where logged and where the differences vary."""
    import statistics

    from grpo_equivalence.analysis import margins
    from grpo_equivalence.analysis import runs as run_files
    from grpo_equivalence.report.render import stats_files

    groups = run_files.group_runs(run_files.load_runs(stats_files(Path(stats_dir))))
    cells = []
    for (backend, steps), runs in sorted(groups.items()):
        if backend == reference or (reference, steps) not in groups:
            continue
        ref = groups[(reference, steps)]
        for key in [*verdict.METRICS, *(f"rewards/{n}/mean" for n in run_files.reward_functions(ref))]:
            if any(run_files.series(r, key) is None for r in [*ref, *runs]):
                continue
            mine = {r["seed"]: verdict.summary(key, run_files.series(r, key)) for r in ref}
            theirs = {r["seed"]: verdict.summary(key, run_files.series(r, key)) for r in runs}
            d = [theirs[s] - mine[s] for s in mine if s in theirs]
            sd = statistics.stdev(d) if len(d) > 1 else 0.0
            if sd > 0:
                cells.append({"candidate": backend, "metric": key, "mean": statistics.fmean(d), "sd": sd,
                              "margin": margins.margin_bound(margins.margin_spec(key), list(mine.values()))})
    return cells
