"""Which train job starts first: the longest expected, so that the GPUs finish together.

With more jobs than GPUs, starting the long jobs first (longest-processing-time first) keeps a long job
from starting last on a GPU while the others sit idle; its makespan is within 4/3 of the optimum.
A job's expected duration is its step count times the median step time its backend measured in an
earlier run of this study (any step count), plus that run's first-step overhead; a backend never run
before counts one second a step, so that among unmeasured backends more steps start first.
"""

import json
from pathlib import Path

from ..runtime.paths import STATS

UNMEASURED_STEP_S = 1.0


def _measured(backend: str, stats_dir: Path) -> tuple[float, float] | None:
    """(median step seconds, overhead seconds) from the backend's latest statistics file, if any."""
    files = sorted(Path(stats_dir).glob(f"grpo_{backend}_*.json"), key=lambda p: p.stat().st_mtime)
    for path in reversed([p for p in files if p.name.removeprefix(f"grpo_{backend}_").removesuffix(".json").isdigit()]):
        try:
            run = json.loads(path.read_text())
            walls = sorted(s["wall_s"] for s in run["steps"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # an unreadable earlier run says nothing about speed
        if walls:
            median = walls[len(walls) // 2]
            return median, max(0.0, run.get("train_wall_s", 0.0) - median * len(walls))
    return None


def expected_seconds(backend: str, steps: int, stats_dir: Path = Path(STATS).parent) -> float:
    measured = _measured(backend, stats_dir)
    if measured is None:
        return steps * UNMEASURED_STEP_S
    step_s, overhead_s = measured
    return overhead_s + steps * step_s


def priority(backend: str, steps: int, stats_dir: Path = Path(STATS).parent) -> int:
    """Snakemake priority (higher starts first): the expected duration in whole seconds."""
    return int(round(expected_seconds(backend, steps, stats_dir)))
