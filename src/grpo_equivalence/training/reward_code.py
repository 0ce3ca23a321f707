"""The files a study's reward code reads: a change in one reruns the jobs that used it (the Snakefile's STUDY_CODE)."""

import ast
import importlib.util
from pathlib import Path

from .rewards import STUDY_SET, _parts


def local_imports(path: Path, seen: set | None = None) -> list[Path]:
    """The modules beside a reward file that it imports (import helper, from helper import bonus; a package folder
    beside it too), and theirs in turn: a change in one changes what the reward computes."""
    seen = set() if seen is None else seen
    found = []
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return found
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    for name in sorted(names):
        for candidate in (path.parent / f"{name}.py", path.parent / name / "__init__.py"):
            if candidate.is_file() and candidate.resolve() not in seen:
                seen.add(candidate.resolve())
                found += [candidate, *local_imports(candidate, seen)]
                if candidate.name == "__init__.py":  # a package's other modules too
                    found += [f for f in sorted(candidate.parent.rglob("*.py")) if f.resolve() not in seen]
                    seen.update(f.resolve() for f in candidate.parent.rglob("*.py"))
    return found


def code_files(specs: list[str]) -> list[str]:
    """The files of the reward code outside this project (resolved specs): a change in one reruns the jobs."""
    files = []
    for spec in specs:
        if spec == STUDY_SET:
            continue
        target, _ = _parts(spec)
        if target.endswith(".py"):
            files += [target, *(str(f) for f in local_imports(Path(target)))]
        elif not target.startswith(__package__ + "."):
            found = importlib.util.find_spec(target)
            if found is not None and found.origin:
                files.append(found.origin)
    return files
