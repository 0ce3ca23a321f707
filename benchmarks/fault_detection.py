"""How often the rollout check calls each injected fault divergent, and a reseeded reference divergent.

Each repetition is one report's rollout check on the tiny study's model: the reference backend at one seed, and
as candidates judged together (Holm over their tests, the reference's own sampler test among them where it reports
its logits) the reference at another seed (the control), the reference with each sampling fault
(grpo_equivalence.training.faults.SAMPLING: drop_weakest is vLLM 0.26's top-p kernel's rule in generate()) and with
the numerics fault (faults.NUMERICS: float8 weights for the rollout), each at a seed of its own. The
sampling is the tiny study's (temperature 1.0, min_p 0.05) or, with --sampling study, config.yaml's (temperature
0.1, min_p 0.5); --dtype bfloat16 --gpu samples and scores in bfloat16 on the GPU. Each check samples rounds to
its plan (grpo_equivalence.checks.power), at most --max-rounds. Each of the --jobs workers builds the backend's
trainer (and a vLLM backend's engine) once and runs its checks through it, each from its own seed, a fault put
into the sampler for its check alone (rollout.check_on; --no-share-sessions: a trainer per check). Prints, per
candidate, the share of repetitions called divergent, equivalent and inconclusive, and the power the reference's
check stated for each fault; writes them as JSON.

    python benchmarks/fault_detection.py [--reps 20] [--jobs 2] [--backend hf] [--sampling tiny|study]
        [--dtype float32|bfloat16] [--gpu] [--max-rounds 1] [--per-call N] [--vllm-share F] [--out OUT.json]

It builds the tiny study's primed model and data first if results/tiny/ lacks them (snakemake).
"""

import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import DATA, MODEL, ROOT, SAMPLING_KEYS, arguments, prepare, print_table, quiet, study  # noqa: E402


# Per worker process, where checks share sessions: the open session of each base backend, and what closes it
_SESSIONS: dict = {}


def _check(job: tuple) -> dict:
    """One rollout check in a worker process (one thread): its file's content. With shared sessions the worker
    builds its backend's trainer (and a vLLM backend's engine) once and checks every seed and sampling fault
    through it (rollout.check_on); otherwise each check builds its own, as the workflow's jobs do."""
    backend, seed, out, settings, candidates, shared = job
    import torch

    torch.set_num_threads(1)
    from grpo_equivalence.checks import rollout
    from grpo_equivalence.training import faults

    config = study(**settings)
    config["backends"] = [config["reference"]] * candidates  # the report's family: planned at its size
    dataset = {"path": "json", "data_files": str(DATA), "name": None}
    if not shared:
        return rollout.check(config, backend, model_path=str(MODEL), dataset=dataset, out=Path(out), seed=seed,
                             log=quiet)
    base = faults.split(backend)[0]
    if base not in _SESSIONS:
        import atexit
        import contextlib

        from grpo_equivalence.training.session import session

        stack = contextlib.ExitStack()
        _SESSIONS[base] = stack.enter_context(session(config, base, 1, model_path=str(MODEL), dataset=dataset,
                                                      seed=seed, log=quiet))
        atexit.register(stack.close)
    return rollout.check_on(_SESSIONS[base], config, backend, out=Path(out), seed=seed, log=quiet)


def rollout_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of the rollout check's benchmark alone."""
    parser.add_argument("--per-call", type=int, default=None, help="prompts per generation call (default: the "
                        "study's 50; on a GPU a round's 400 prompts in one call is several times faster)")
    parser.add_argument("--share-sessions", action=argparse.BooleanOptionalAction, default=True,
                        help="each worker builds its backend's trainer (and vLLM engine) once and checks every seed "
                        "and sampling fault through it (default); --no-share-sessions builds one per check")
    parser.add_argument("--order", choices=("transformers", "vllm"), default=None, help="the order of the filters "
                        "the check scores with (rollout_check.order; default the order the backend's sampler applies: "
                        "vLLM's for a vLLM backend), so that the faults are measured against the sampler's own")
    parser.add_argument("--vllm-share", type=float, default=None, help="the GPU memory fraction each vLLM engine "
                        "reserves (default: the backend's; JOBS engines run at once)")
    parser.add_argument("--resume", action="store_true", help="keep the checks an earlier call of this row left in "
                        "its folder (same backend, seed, sampling and cap on rounds) and run only the others")
    parser.add_argument("--merge", nargs="+", metavar="ROW.json", default=None, help="join rows of one setting run "
                        "at other seeds (calls of a row that one GPU session could not finish) into --out, and stop")
    parser.add_argument("--across-commits", action="store_true", help="with --merge: join rows judged by other "
                        "commits, once `git diff` shows the check's code the same in both")
    parser.add_argument("--exact-top-p", action="store_true", help="backend_options exact_top_p: true (trl_vllm: "
                        "vLLM's sort-based top-k/top-p at every batch size, not its Triton kernel)")
    return parser


def main() -> None:
    args = rollout_arguments(arguments(__doc__.splitlines()[0], 20, "fault_detection.json")).parse_args()
    if args.merge:
        rows = [json.loads(Path(f).read_text()) for f in args.merge]
        Path(args.out).write_text(json.dumps(merge(rows, args.across_commits), indent=1) + "\n")
        return
    prepare(args)
    from grpo_equivalence.analysis import verdict
    from grpo_equivalence.checks import power, rollout_verdict
    from grpo_equivalence.training import backends, faults

    settings = {"sampling": args.sampling, "dtype": args.dtype, "gpu": args.gpu, "max_rounds": args.max_rounds,
                "margin": args.margin, "per_call": args.per_call, "vllm_share": args.vllm_share,
                "order": args.order or backends.get(args.backend).sampler_order, "exact_top_p": args.exact_top_p}
    if args.exact_top_p and "exact_top_p" not in backends.get(args.backend).options:
        raise SystemExit(f"--exact-top-p: {args.backend} has no exact_top_p option (trl_vllm has)")
    config = study(**settings)
    scratch = ROOT / "results/benchmarks/fault_detection" / (f"{args.backend}-{args.sampling}-{args.dtype}"
                                                             + ("-exact_top_p" if args.exact_top_p else ""))
    # the faults this backend can have put in (drop_weakest and fp8_rollout: transformers' generate(), and the
    # native decoder for fp8_rollout; a vLLM engine samples with its own kernel and holds its own weights)
    vllm = backends.get(args.backend).sampler_logits == "vllm" or "vllm" in args.backend
    candidates = ["control", *[f for f in faults.ROLLOUT if not (vllm and f in ("drop_weakest", "fp8_rollout"))
                               and not (args.backend == "native" and f == "drop_weakest")]]
    jobs = []
    for rep in range(args.reps):
        base = args.first_seed + 100 * rep  # seeds apart from the study's, one per check
        named = [(args.backend, "reference"), (args.backend, "control"),
                 *[(f"{args.backend}+{fault}", fault) for fault in candidates[1:]]]
        jobs += [(backend, base + i, scratch / f"{rep}_{name}.json", settings, len(candidates), args.share_sessions)
                 for i, (backend, name) in enumerate(named)]
    start = time.perf_counter()
    files, failed = _run_all(jobs, args, start)
    args.reps = len(files) // len(jobs[:len(candidates) + 1])  # the repetitions finished before the deadline
    if not files:
        raise SystemExit(f"no repetition finished within the deadline of {args.deadline} s: give it more time")
    rows = (["reference"] if backends.get(args.backend).sampler_logits else []) + candidates
    counts = {c: dict.fromkeys((verdict.DIVERGENT, verdict.EQUIVALENT, verdict.INCONCLUSIVE), 0) for c in rows}
    by_test = {c: {t: 0 for t in rollout_verdict.TESTS} for c in rows}
    stated = {c: [] for c in candidates}
    checks = []  # per repetition and candidate, what its verdict was made of
    width = len(candidates) + 1
    check = config["rollout_check"]
    alpha = config["verdict"]["alpha"]
    for rep in range(args.reps):
        reference, *others = files[rep * width:(rep + 1) * width]
        comparisons = [rollout_verdict.compare(reference, other, alpha=alpha, support_margin=check["support_margin"],
                                               margin_sd=check["margin"],
                                               numerics_bound=check["numerics_bound"]) for other in others]
        if reference.get("sampler_logits"):  # its own sampler, judged in the same family, as the report does
            comparisons.insert(0, rollout_verdict.own_check(reference, alpha=alpha,
                                                            support_margin=check["support_margin"]))
        rollout_verdict.finalize(comparisons, alpha)
        tokens = sum(c["tokens"] for c in reference["completions"])
        one_sample = bool(reference.get("sampler_logits"))
        for row in power.statements(reference["own_profile"] if one_sample else reference["profile"], tokens,
                                    alpha=alpha, family=comparisons[0]["family_size"], one_sample=one_sample,
                                    paired=power.paired_rates(reference["completions"], check["margin"])):
            # every fault the plan names, also one not injected into this backend (vLLM's kernel is drop_weakest)
            stated.setdefault(row["fault"] or "control", []).append(row)
        for name, comparison in zip(rows, comparisons, strict=True):
            counts[name][comparison["verdict"]] += 1
            for test in rollout_verdict.TESTS:
                by_test[name][test] += comparison["tests"].get(test, {}).get("verdict") == verdict.DIVERGENT
            checks.append(_evidence(rep, name, comparison))
    tokens = sum(c["tokens"] for f in files for c in f["completions"]) / len(files)
    rounds = sum(f["rounds"] for f in files) / len(files)
    summary = {name: _stated(found) for name, found in stated.items() if found}
    print(f"rollout check, tiny model, {args.backend}, {args.sampling} sampling {config['grpo']['temperature']} / "
          f"min_p {config['grpo']['min_p']}, {args.dtype}{' on the GPU' if args.gpu else ''}: {args.reps} repetitions, "
          f"{tokens:.0f} tokens and {rounds:.2f} rounds per check, {time.perf_counter() - start:.0f} s")
    print_table(("Divergent", "Equivalent", "Inconclusive"), "test", rollout_verdict.TESTS, counts, by_test, args)
    for name, row in summary.items():
        print(f"  stated for {name}: {row}")
    Path(args.out).write_text(json.dumps({
        "reps": args.reps, "first_seed": args.first_seed, "backend": args.backend, "sampling": {k: config["grpo"][k] for k in SAMPLING_KEYS},
        "dtype": args.dtype, "gpu": args.gpu, "max_rounds": args.max_rounds, "temperature_margin":
        check["temperature_margin"], "order": check["order"], "prompts_per_call": check["prompts_per_call"],
        "shared_sessions": args.share_sessions, "exact_top_p": args.exact_top_p,
        "sampler_logits": files[0].get("sampler_logits"), "numerics_bound": check["numerics_bound"],
        "tokens_per_check": tokens,
        "rounds_per_check": rounds, "counts": counts,
        "divergent_by_test": by_test, "stated": summary,
        "stated_rows": stated, "checks": checks, "failed_checks": failed,
        "environment": files[0]["environment"]},
        indent=1) + "\n")


def _run_all(jobs: list, args, start: float) -> tuple[list, list]:
    """Every check, JOBS at a time, a line per finished one. Past --deadline seconds the row stops: checks still
    running are abandoned (their processes ended) and only whole repetitions are kept, so that a row always ends
    with its figures within the deadline and the time one check takes. A check that fails (one of sixteen vLLM
    engines starting at once lost its port to another, on an H200) drops its repetition, not the row: the
    repetitions judged are the whole ones, and the failures are returned (backend, seed, error) for the row's file."""
    from concurrent.futures import FIRST_COMPLETED, wait

    width = len(jobs) // args.reps
    done = _resumed(jobs) if getattr(args, "resume", False) else {}
    failed = []
    pool = ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"))
    pending = {pool.submit(_check, job): i for i, job in enumerate(jobs) if i not in done}
    try:
        while pending:
            left = args.deadline - (time.perf_counter() - start) if args.deadline else None
            if left is not None and left <= 0:
                print(f"  deadline of {args.deadline:.0f} s: {len(pending)} checks not finished dropped", flush=True)
                break
            finished, _ = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
            for future in finished:
                i = pending.pop(future)
                try:
                    done[i] = future.result()
                except Exception as error:  # noqa: BLE001 (any failure of one check: named, its repetition dropped)
                    message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
                    failed.append({"backend": jobs[i][0], "seed": jobs[i][1], "error": message})
                    print(f"  check failed, its repetition dropped: {jobs[i][0]} seed {jobs[i][1]}: {message}",
                          flush=True)
                    continue
                print(f"  {len(done)}/{len(jobs)} checks, {time.perf_counter() - start:.0f} s: {jobs[i][0]} seed "
                      f"{jobs[i][1]}, {done[i]['rounds']} round(s), {sum(c['tokens'] for c in done[i]['completions'])} "
                      f"tokens", flush=True)
    finally:
        processes = list((pool._processes or {}).values())  # the executor has no public way to stop a running call
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
    whole = [rep for rep in range(args.reps) if all(rep * width + k in done for k in range(width))]
    return [done[rep * width + k] for rep in whole for k in range(width)], failed


# What rows must share to be joined: the settings and the code that judged them
_SAME = ("backend", "sampling", "dtype", "gpu", "max_rounds", "temperature_margin", "order", "prompts_per_call",
         "shared_sessions", "exact_top_p", "sampler_logits", "numerics_bound")


def merge(rows: list[dict], across_commits: bool = False) -> dict:
    """Rows of one setting run at other seeds as one row: counts summed, checks and statements joined, the
    repetitions renumbered in order. Refuses rows of other settings, rows whose seeds overlap (a repetition counted
    twice), rows written before the file recorded its first seed and statements, and rows of other commits unless
    across_commits (the caller has seen that the check's code did not change between them; each row's commit is
    kept in git_commits). A joined row joins again: it keeps each call's first seed, repetitions and commit
    (`parts`)."""
    for row in rows:
        if "first_seed" not in row or "stated_rows" not in row:
            raise SystemExit("--merge: a row written before rows recorded first_seed and stated_rows cannot be "
                             "joined; run it again")
        if isinstance(row["first_seed"], list) and "parts" not in row:
            raise SystemExit("--merge: a row joined before joined rows recorded their parts cannot be joined again; "
                             "join the rows it was made of")
    first = rows[0]
    for row in rows[1:]:
        differ = [key for key in _SAME if row.get(key) != first.get(key)]
        if row["environment"].get("git_commit") != first["environment"].get("git_commit") and not across_commits:
            differ.append("environment.git_commit")
        if differ:
            raise SystemExit(f"--merge: the rows differ in {', '.join(differ)}; join only rows of one setting, "
                             "judged by one commit (--across-commits where `git diff A B -- src benchmarks` shows "
                             "the check unchanged)")
    parts = [part for row in rows for part in row.get("parts") or [
        {"first_seed": row["first_seed"], "reps": row["reps"], "git_commit": row["environment"].get("git_commit")}]]
    spans = sorted((part["first_seed"], part["first_seed"] + 100 * part["reps"]) for part in parts)
    if any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])):
        raise SystemExit(f"--merge: the rows' seeds overlap ({spans}): give each call its own --first-seed")
    joined = {key: first[key] for key in first if key not in ("counts", "divergent_by_test", "checks")}
    reps = sum(row["reps"] for row in rows)
    checks, offset = [], 0
    for row in rows:
        checks += [{**check, "rep": check["rep"] + offset} for check in row["checks"]]
        offset += row["reps"]
    stated = {}
    for row in rows:
        for name, found in row["stated_rows"].items():
            stated.setdefault(name, []).extend(found)
    def summed(key: str) -> dict:
        return {name: {k: sum(row[key][name][k] for row in rows) for k in first[key][name]} for name in first[key]}
    joined.update(reps=reps, first_seed=[part["first_seed"] for part in parts], parts=parts,
                  git_commits=[part["git_commit"] for part in parts], counts=summed("counts"),
                  divergent_by_test=summed("divergent_by_test"), checks=checks, stated_rows=stated,
                  stated={name: _stated(found) for name, found in stated.items() if found},
                  failed_checks=[failed for row in rows for failed in row["failed_checks"]],
                  tokens_per_check=sum(row["tokens_per_check"] * row["reps"] for row in rows) / reps,
                  rounds_per_check=sum(row["rounds_per_check"] * row["reps"] for row in rows) / reps)
    return joined


def _resumed(jobs: list) -> dict[int, dict]:
    """The checks an earlier call of this row left in its folder (--resume), by job: kept where the file is a whole
    check of today's schema by the same backend, seed, sampling and cap on rounds (a call cut short resumes where it
    stopped; the seeds make a check the same whoever ran it)."""
    from grpo_equivalence.analysis.stats import StatsError
    from grpo_equivalence.checks import rollout

    found = {}
    for i, (backend, seed, out, settings, *_rest) in enumerate(jobs):
        try:
            run = rollout.load(out) if Path(out).exists() else None
        except StatsError:
            continue
        wanted = study(**settings)
        if run and run["backend"] == backend and run["seed"] == seed and run["schema_version"] == \
                rollout.SCHEMA_VERSION and run["max_rounds"] == wanted["rollout_check"]["max_rounds"] and all(
                run["sampling"].get(key) == wanted["grpo"][key] for key in SAMPLING_KEYS if key in run["sampling"]):
            found[i] = run
    if found:
        print(f"  {len(found)}/{len(jobs)} checks resumed from {Path(jobs[0][2]).parent}", flush=True)
    return found


def _evidence(rep: int, name: str, comparison: dict) -> dict:
    """One candidate's verdict in one repetition and the figures behind it: per test its verdict; the outside count
    and score z (on its own logits where it reported them, else against the reference's: [candidate, reference]),
    the score's difference and margins, the numerics (mean |logp difference|, candidate's and reference's, and the
    bound), and where a backend returned processed log-probabilities only, their mismatch figures
    (rollout_scoring.mismatch_figures)."""
    tests = comparison["tests"]
    support, score, numerics = tests["support"], tests["score"], tests.get("numerics") or {}
    mismatch = {side: None if not m else [m.get(key) for key in ("token_mult_prob_error", "mean_logp_diff",
                                                                 "sampler_sure", "unsure_positions")]
                for side, m in comparison["mismatch"].items()}
    return {"rep": rep, "candidate": name, "verdict": comparison["verdict"], "exact": bool(support.get("exact")),
            "tests": {test: found["verdict"] for test, found in tests.items()},
            "outside": [support["candidate_outside"], support.get("reference_outside")],
            "score_z": [score["candidate_z"], score.get("reference_z")],
            "score_difference": score["difference"], "score_margins": score["margins"],
            "numerics": [numerics.get("candidate_mean"), numerics.get("reference_mean"), numerics.get("bound")],
            "tokens": [comparison["tokens"]["candidate"], comparison["tokens"]["reference"]],
            "mismatch": [mismatch["candidate"], mismatch["reference"]]}


def _stated(rows: list[dict]) -> dict:
    """The reference checks' statements for one fault over the repetitions: its kinds, median power and tokens."""
    import statistics

    powers = [r["power"] for r in rows if r["power"] is not None]
    needed = [r["tokens_needed"] for r in rows if r["tokens_needed"] is not None]
    return {"kinds": sorted({r["kind"] for r in rows}), "median_power": statistics.median(powers) if powers else None,
            "median_tokens_needed": statistics.median(needed) if needed else None,
            "unreachable": sum(r["tokens_needed"] is None for r in rows)}


if __name__ == "__main__":
    main()
