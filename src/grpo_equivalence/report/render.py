"""The equivalence report rendered from its Jinja template (report_templates/, a file per section): per step
count the verdicts with their evidence, speed and memory, the settings and warnings that differ between backends;
then the study's settings. What each section shows is computed in sections."""

from pathlib import Path

from ..analysis import runs as run_files
from ..analysis import stats as stats_io
from ..analysis import effects, verdict
from ..analysis.compare import COMPARED, NOT_LOGGED, compare
from ..analysis.summary import DEFAULT_SKIP, summarise
from ..runtime.paths import CURVES_FIGURE, SPEED_FIGURE, TEMPLATES
from ..training import faults
from . import answer
from .sections import NOT_RECORDED, SHARED_GPU, reference_run, step_tables, study_settings, warnings_by_backend

TEMPLATE = TEMPLATES / "grpo_equivalence.md.j2"


def template_files(template: Path = TEMPLATE) -> list[Path]:
    """The template and every template beside or below it, which it may include: what the report is made of."""
    folder = Path(template).parent
    return [Path(template), *sorted(p for p in folder.rglob("*.j2") if p != Path(template))]


FAULT_MARK = " (injected fault)"


def _cell(value) -> str:
    """A value as one Markdown table cell: a `|` would end the cell and a newline the row. A backend run with an
    injected fault (BACKEND+FAULT) is marked wherever a table names it: never to be read as a backend's own."""
    text = str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
    return text + FAULT_MARK if isinstance(value, str) and faults.split(value)[1] in faults.FAULTS else text


def _sig(value, digits: int = 4) -> str:
    """A number with `digits` significant digits (differences of metrics that live on any scale)."""
    return NOT_LOGGED if value is None else f"{value:.{digits}g}"


# One word for a verdict across the report: an open verdict is "open" wherever the report prints it
SAID = {verdict.INCONCLUSIVE: "open"}


def _word(value) -> str:
    return SAID.get(value, value)


def _num(value, digits: int = 3) -> str:
    if value is None:
        return NOT_LOGGED
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-3 and value != 0 else f"{value:.{digits}f}"
    return str(value)


def environment(folder: Path = TEMPLATE.parent):
    """The Jinja environment the report's templates render in, with the report's filters: one place for both the
    report and a section rendered on its own."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(num=_num, sig=_sig, cell=_cell, word=_word, effect=effects.words)
    env.tests["search"] = lambda value, text: text in (value or "")
    return env


NOTES = ".report-notes.txt"  # beside the report: what the workflow says on the console at its end


def render(*, summaries: list[dict], comparisons: list[dict], reference: str, runs: dict, figures: dict | None = None,
           template: Path = TEMPLATE, rollout: dict | None = None, alpha: float = verdict.ALPHA,
           margin: float = verdict.MARGIN, margins: dict | None = None, trainer: dict | None = None) -> str:
    """`runs`: {path: stats} of every run (all seeds); `figures`: {"curves": {steps: path}, "speed": path}, paths
    relative to the report's folder, or None where no figure was made; `rollout`: rollout_section's result;
    `trainer`: trainer_section's."""
    env = environment(Path(template).parent)
    groups = run_files.group_runs(runs)
    primaries = [group[0] for group in groups.values()]
    tables = step_tables(summaries, comparisons, groups, reference, alpha=alpha, margin=margin, margins=margins)
    skip = summaries[0]["median_over_steps"][0] - 1 if summaries else DEFAULT_SKIP
    named = sorted({r["backend"] for r in primaries} | {c["label"] for c in (rollout or {}).get("comparisons", [])})
    return env.get_template(Path(template).name).render(
        reference=reference, tables=tables, answer=answer.rows(tables, groups, reference, skip, rollout, trainer),
        edited=sorted(str(path) for path in runs if stats_io.edited(path)),
        report_risk=report_risk(comparisons, alpha),
        metrics=COMPARED, summaries={m: text for m, (text, _) in verdict.SUMMARIES.items()}, looks=verdict.LOOKS,
        verdicts=verdict, not_logged=NOT_LOGGED, not_recorded=NOT_RECORDED, shared_gpu=SHARED_GPU,
        figures=figures or {},
        settings=study_settings(reference_run(primaries, reference)), warnings=warnings_by_backend(list(runs.values())),
        backends=sorted({r["backend"] for r in primaries}), stats_files=sorted(map(str, runs)), rollout=rollout,
        trainer=trainer,
        faulted={b: faults.FAULTS[f] for b in named if (f := faults.fault_of(b)) in faults.FAULTS},
        configured={b: (faults.split(b)[0], faults.CONFIGURATIONS[c]["what"]) for b in named
                    if (c := faults.configuration_of(b))})


def figures_in(folder: Path, relative_to: Path) -> dict:
    """The workflow's figures (paths.CURVES_FIGURE, paths.SPEED_FIGURE by name) found in `folder`, as render takes
    them: paths relative to `relative_to`, the report's folder."""
    import os

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder; pass the folder holding curves_<steps>.png and speed_memory.png")
    rel = lambda path: os.path.relpath(path, relative_to)  # noqa: E731
    prefix, suffix = Path(CURVES_FIGURE).name.split("{steps}")
    curves = {int(p.name.removeprefix(prefix).removesuffix(suffix)): rel(p) for p in folder.glob(f"{prefix}*{suffix}")
              if p.name.removeprefix(prefix).removesuffix(suffix).isdigit()}
    speed = folder / Path(SPEED_FIGURE).name
    return {"curves": curves, "speed": rel(speed) if speed.exists() else None}


def stats_files(folder: Path) -> list[Path]:
    """The statistics files in `folder`: grpo_<backend>_<steps>[_seed<seed>].json, or .json.gz, not summaries."""
    found = sorted([*Path(folder).glob("grpo_*.json"), *Path(folder).glob("grpo_*.json.gz")])
    return [p for p in found if not p.name.endswith((".summary.json", ".summary.json.gz"))]


def from_stats_dir(stats_dir: Path, reference: str, skip: int = DEFAULT_SKIP, template: Path = TEMPLATE, *,
                   alpha: float = verdict.ALPHA, margin: float = verdict.MARGIN, margins: dict | None = None,
                   figures: dict | None = None, rollout: dict | None = None, trainer: dict | None = None) -> str:
    """The report of every statistics file in `stats_dir` (grpo_<backend>_<steps>[_seed<seed>].json), as grpo-report
    makes it: each backend's runs of one step count are its seeds, the reference's measure the noise floor."""
    stats_dir = Path(stats_dir)
    if not stats_dir.is_dir():
        raise FileNotFoundError(f"{stats_dir} is not a folder; pass the folder holding the grpo_<backend>_<steps>.json files")
    paths = stats_files(stats_dir)
    if not paths:
        raise FileNotFoundError(f"no statistics files (grpo_<backend>_<steps>.json) in {stats_dir}")
    return render(**judged(run_files.load_runs(paths), reference, skip, alpha=alpha, margin=margin, margins=margins),
                  reference=reference, template=template, figures=figures, rollout=rollout, trainer=trainer, alpha=alpha,
                  margin=margin,
                  margins=margins)


def judged(runs: dict, reference: str, skip: int = DEFAULT_SKIP, *, alpha: float = verdict.ALPHA,
           margin: float = verdict.MARGIN, margins: dict | None = None) -> dict:
    """What render takes of a set of runs ({path: stats}): every backend's summary and its comparison with the
    reference at each step count."""
    groups = run_files.group_runs(runs)
    reference_run([group[0] for group in groups.values()], reference)  # fails early, naming the backends found
    summaries = [summarise(group[0], skip) for group in groups.values()]
    comparisons = [compare(groups[(reference, steps)], group, alpha=alpha, margin=margin, margins=margins)
                   for (backend, steps), group in groups.items() if backend != reference and (reference, steps) in groups]
    return {"summaries": summaries, "comparisons": comparisons, "runs": runs}


def report_risk(comparisons: list[dict], alpha: float) -> dict:
    """The chance that some verdict of the report is falsely divergent, where every candidate were the reference
    under another name: each candidate at each step count is its own family at alpha (one comparison), so with F
    families (C candidates x S step counts) at most 1 - (1 - alpha)^F for independent families and at most F x alpha
    whatever their dependence (they share the reference's runs, and a backend's step counts share its seeds)."""
    candidates = len({c["candidate"] for c in comparisons})
    families = len({(c["candidate"], c["max_steps"]) for c in comparisons})
    return {"candidates": candidates, "step_counts": len({c["max_steps"] for c in comparisons}), "families": families,
            "independent": 1 - (1 - alpha) ** families, "bound": min(1.0, families * alpha), "alpha": alpha}

