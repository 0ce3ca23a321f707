"""The committed example reports made again from their committed files with today's report (grpo-report): each
example's statistics, its rollout checks and trainer checks where they are kept and today's code reads them, its
figures, and its study's reference. A report's method and words change with the code; its runs do not.

    python benchmarks/rerender_examples.py [--check] [NAME ...]   (default every example with a report)

--check writes nothing and exits 1 if a committed report differs from what its files give today.
"""

import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

EXAMPLES = ROOT / "docs" / "examples"


def sources(example: Path) -> dict:
    """What grpo-report reads for `example`: its reference and the folders it keeps."""
    import yaml

    study = yaml.safe_load((example / "study.yaml").read_text())
    found = {"reference": study["reference"], "stats": example / "stats"}
    for name in ("rollout", "trainer", "figures"):
        folder = example / name
        if folder.is_dir() and any(folder.iterdir()):
            found[name] = folder
    return found


def render(example: Path) -> str:
    """The example's report as today's code makes it from its files (the rollout checks left out where today's code
    refuses them as evidence: their README says why)."""
    from grpo_equivalence.analysis.stats import StatsError
    from grpo_equivalence.report import render as rendering
    from grpo_equivalence.report import sections

    found = sources(example)
    with contextlib.chdir(example):  # the report names its files relative to its folder, as grpo-report run there
        here = {k: Path(v.name) if isinstance(v, Path) else v for k, v in found.items()}
        figures = rendering.figures_in(here["figures"], Path(".")) if "figures" in here else None
        trainer = sections.trainer_from_dir(here["trainer"]) if "trainer" in here and \
            any(here["trainer"].glob("*_vs_*.json")) else None
        rollout = None
        if "rollout" in here:
            try:
                rollout = sections.rollout_from_dir(here["rollout"], here["reference"])
            except StatsError as refused:
                print(f"{example.name}: its rollout checks are left out: {refused}", file=sys.stderr)
        return rendering.from_stats_dir(here["stats"], here["reference"], figures=figures, rollout=rollout,
                                        trainer=trainer)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    names = [a for a in argv if not a.startswith("--")]
    examples = [EXAMPLES / n for n in names] if names else \
        sorted(p for p in EXAMPLES.iterdir() if (p / "grpo_equivalence.md").exists() and (p / "study.yaml").exists())
    stale = []
    for example in examples:
        text = render(example)
        target = example / "grpo_equivalence.md"
        if not target.exists() or target.read_text() != text:
            stale.append(example.name)
            if not check:
                target.write_text(text)
        print(f"{example.name}: {'differs' if check and example.name in stale else 'written' if not check else 'current'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
