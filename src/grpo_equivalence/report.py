"""The equivalence report: speed and memory per step count, differences against the reference, settings."""

import re
from pathlib import Path

from . import stats as stats_io
from .compare import COMPARED, NOT_LOGGED, compare
from .summary import DEFAULT_SKIP, summarise

TEMPLATE = Path(__file__).resolve().parents[2] / "report_templates" / "grpo_equivalence.md.j2"
STATS_NAME = re.compile(r"^grpo_(?P<backend>.+)_(?P<steps>\d+)\.json$")  # paths.STATS, as a regex


def speed_tables(summaries: list[dict], comparisons: list[dict], reference: str) -> list[dict]:
    """One table per step count: the runs' summaries with % of the reference's speed, and its comparisons."""
    tables = []
    for steps in sorted({s["max_steps"] for s in summaries}):
        rows = sorted((s for s in summaries if s["max_steps"] == steps), key=lambda s: (s["backend"] != reference, s["backend"]))
        ref = next((s for s in rows if s["backend"] == reference), None)
        if ref is None:
            raise stats_io.StatsError(f"no {reference} run with {steps} steps: the reference must have run every step count")
        table_rows = [dict(row, pct_of_reference=100.0 * ref["median_step_s"] / row["median_step_s"]) for row in rows]
        pairs = sorted((c for c in comparisons if c["max_steps"] == steps), key=lambda c: c["candidate"])
        tables.append({"steps": steps, "rows": table_rows, "pairs": pairs})
    return tables


def study_settings(reference_stats: dict) -> dict:
    config = reference_stats["effective_config"]
    return {"model": reference_stats["model"], "dataset": reference_stats["dataset"], "seed": reference_stats["seed"],
            "trainer": config.get("trainer", {}), "lora": config.get("lora"), "generation": config.get("generation"),
            "memory_measure": reference_stats.get("memory_measure"), "environment": reference_stats["environment"]}


def _num(value, digits: int = 3) -> str:
    if value is None:
        return NOT_LOGGED
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-3 and value != 0 else f"{value:.{digits}f}"
    return str(value)


def render(*, summaries: list[dict], comparisons: list[dict], reference: str, reference_stats: dict,
           stats_files: list[str], template: Path = TEMPLATE) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(template).parent)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["num"] = _num
    return env.get_template(Path(template).name).render(
        reference=reference, tables=speed_tables(summaries, comparisons, reference), metrics=COMPARED,
        not_logged=NOT_LOGGED, settings=study_settings(reference_stats), stats_files=sorted(stats_files))


def from_stats_dir(stats_dir: Path, reference: str, skip: int = DEFAULT_SKIP, template: Path = TEMPLATE) -> str:
    """The report of every statistics file in `stats_dir` (grpo_<backend>_<steps>.json), as grpo-report makes it."""
    runs = {}
    for path in sorted(Path(stats_dir).glob("grpo_*.json")):
        match = STATS_NAME.match(path.name)
        if match is None:  # summaries (.summary.json) and anything else
            continue
        runs[path] = stats_io.load(path)
    if not runs:
        raise FileNotFoundError(f"no statistics files (grpo_<backend>_<steps>.json) in {stats_dir}")
    refs = {s["max_steps"]: s for s in runs.values() if s["backend"] == reference}
    if not refs:
        backends = sorted({s["backend"] for s in runs.values()})
        raise stats_io.StatsError(f"no run of reference backend {reference!r} in {stats_dir}; backends there: {backends}")
    summaries = [summarise(s, skip) for s in runs.values()]
    comparisons = [compare(refs[s["max_steps"]], s) for s in runs.values()
                   if s["backend"] != reference and s["max_steps"] in refs]
    return render(summaries=summaries, comparisons=comparisons, reference=reference,
                  reference_stats=refs[min(refs)], stats_files=[str(p) for p in runs], template=template)
