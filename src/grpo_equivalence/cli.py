"""Console scripts: each stage of the workflow on statistics files made anywhere."""

import argparse
import json
import sys
from pathlib import Path

from .analysis import stats, verdict
from .analysis.compare import compare
from .analysis.summary import DEFAULT_SKIP, summarise
from .report import render, sections


def _write(text: str, out: str | None, force: bool) -> None:
    """To `out` (never over an existing file unless --force), or to stdout."""
    if out is None:
        sys.stdout.write(text)
        return
    path = Path(out)
    if path.exists() and not force:
        sys.exit(f"error: {path} exists; pass --force to overwrite it or choose another -o")
    try:
        stats.write_text(path, text)  # a full disk leaves the old file (or none), never a truncated one
    except OSError as error:
        kept = "the file there is unchanged" if path.exists() else "nothing was written"
        sys.exit(f"error: {path} could not be written ({error.strerror or error}); {kept}: free space or choose "
                 f"another -o")
    print(f"wrote {path}", file=sys.stderr)


def _run(main):
    """Known failures as one line with the fix, not a traceback."""
    try:
        main()
    except (stats.StatsError, FileNotFoundError, KeyError) as error:
        sys.exit(f"error: {error}")


def summarise_main(argv=None):
    parser = argparse.ArgumentParser(prog="grpo-summarise", description="Train wall, median step time and peak memory of one run.")
    parser.add_argument("stats", help="a run's statistics file (grpo_<backend>_<steps>.json)")
    parser.add_argument("-o", "--output", help="write the summary JSON here (default: stdout)")
    parser.add_argument("--skip", type=int, default=DEFAULT_SKIP, help="warm-up steps left out of the median (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output")
    args = parser.parse_args(argv)
    _run(lambda: _write(stats.to_json(summarise(stats.load(args.stats), args.skip)), args.output, args.force))


def _verdict_arguments(parser) -> None:
    """How a difference is judged: the study's verdict section, on the command line."""
    parser.add_argument("--alpha", type=float, default=verdict.ALPHA, help="error rate of each verdict (default: %(default)s)")
    parser.add_argument("--margin", type=float, default=verdict.MARGIN, help="largest difference still equivalent, in "
                        "standard deviations of a seed-to-seed difference of the reference, for the metrics without "
                        "a margin of their own (default: %(default)s)")
    parser.add_argument("--margins", type=json.loads, default=None, help="each metric's own margin, as a study's "
                        "verdict.margins sets it, in JSON: '{\"kl\": {\"ratio\": 1.25}, \"reward\": {\"absolute\": 0.05}}' "
                        "(default: kl within 1.5x, grad_norm 1.25x)")


def compare_main(argv=None):
    parser = argparse.ArgumentParser(prog="grpo-compare", description="A candidate's runs against the reference's at one "
                                     "step count: step by step, against the reference's seed-to-seed noise, with a verdict per metric.")
    parser.add_argument("--ref", required=True, nargs="+", help="the reference's statistics files, the study's seed first, "
                        "then its replicates (at least 2 runs for a noise floor)")
    parser.add_argument("--candidate", required=True, nargs="+", help="the candidate's statistics files, the study's seed first")
    _verdict_arguments(parser)
    parser.add_argument("-o", "--output", help="write the comparison JSON here (default: stdout)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output")
    args = parser.parse_args(argv)
    _run(lambda: _write(stats.to_json(compare([stats.load(p) for p in args.ref], [stats.load(p) for p in args.candidate],
                                              alpha=args.alpha, margin=args.margin, margins=args.margins)),
                        args.output, args.force))


def report_main(argv=None):
    parser = argparse.ArgumentParser(prog="grpo-report", description="The equivalence report from a folder of statistics files.")
    parser.add_argument("--stats-dir", required=True, help="folder holding grpo_<backend>_<steps>.json files")
    parser.add_argument("--reference", required=True, help="the backend every other one is compared with")
    parser.add_argument("-o", "--output", help="write the Markdown report here (default: stdout)")
    parser.add_argument("--skip", type=int, default=DEFAULT_SKIP, help="warm-up steps left out of the median (default: %(default)s)")
    _verdict_arguments(parser)
    parser.add_argument("--template", type=Path, default=render.TEMPLATE, help="Jinja template (default: %(default)s)")
    parser.add_argument("--figures", help="link the workflow's figures found in this folder (curves_<steps>.png, "
                        "speed_memory.png)")
    parser.add_argument("--rollout", help="judge the rollout checks found in this folder (<backend>[_seed<seed>].json, or "
                        ".json.gz; the workflow's results/rollout)")
    parser.add_argument("--trainer", help="show the trainer check's comparisons found in this folder "
                        "(<backend>_vs_<reference>.json; the workflow's results/trainer)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output")
    args = parser.parse_args(argv)
    if not args.template.exists():
        sys.exit(f"error: template {args.template} not found; pass --template report_templates/grpo_equivalence.md.j2 "
                 f"from a checkout of this project")
    report_dir = Path(args.output).parent if args.output else Path.cwd()
    _run(lambda: _write(render.from_stats_dir(
        Path(args.stats_dir), args.reference, args.skip, args.template, alpha=args.alpha, margin=args.margin,
        margins=args.margins,
        figures=render.figures_in(Path(args.figures), report_dir) if args.figures else None,
        rollout=sections.rollout_from_dir(Path(args.rollout), args.reference, alpha=args.alpha) if args.rollout else None,
        trainer=sections.trainer_from_dir(Path(args.trainer)) if args.trainer else None),
        args.output, args.force))

