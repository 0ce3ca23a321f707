"""What code a job runs, by content: the rerun trigger of every rule.

Snakemake reruns a job when its params change, and (for `script:` rules) when the script's modification
time does, but not when a module the job imports changes, and a fresh clone's new timestamps would rerun
everything. So each rule takes, as a param, a hash of the content of the package modules it imports
(followed transitively through the package's own imports) plus any other file it reads: editing one
backend's loader then reruns that backend's train jobs only, and an unchanged tree reruns nothing
whatever its timestamps.
"""

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # the grpo_equivalence package (this module is in its runtime/)
NAME = PACKAGE.name


@functools.cache  # the package's files do not come and go while one process plans
def _file_of(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != NAME:
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [NAME, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Package modules that `path` imports, at top level or inside functions."""
    info = path.stat()
    return set(_parsed_imports(path, info.st_mtime_ns, info.st_size))


# Planning hashes the code of every job, many of them the same modules: each file is parsed once per content
# (its modification time and size stand for it) in a Snakemake process, not once per job (seconds a plan).
@functools.cache
def _parsed_imports(path: Path, mtime_ns: int, size: int) -> frozenset[str]:
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from . import x` may name a module
    return frozenset(name for name in found if _file_of(name) is not None)


def script_imports(script: Path) -> list[str]:
    """Package modules a script outside the package imports (absolute imports only, as scripts make)."""
    info = Path(script).stat()
    return _parsed_script_imports(Path(script), info.st_mtime_ns, info.st_size)


@functools.cache
def _parsed_script_imports(script: Path, mtime_ns: int, size: int) -> list[str]:
    found = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return sorted(name for name in found if _file_of(name) is not None)


def module_files(*modules: str) -> list[Path]:
    """The files of `modules` and of every package module they import, transitively."""
    seen: set[Path] = set()
    todo = [f for f in map(_file_of, modules) if f is not None]
    missing = [m for m in modules if _file_of(m) is None]
    if missing:
        raise ValueError(f"not modules of {NAME}: {missing}")
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        package = path.parent.parent if path.name == "__init__.py" else path.parent
        if package != PACKAGE and package.is_relative_to(PACKAGE) and (package / "__init__.py").exists():
            todo.append(package / "__init__.py")  # importing a.b.c runs a/b/__init__.py first (and a's, in turn)
        if path.suffix != ".py":
            continue
        todo.extend(_file_of(name) for name in _imports(path))
        source = path.read_text()  # the data a module reads beside it, named in its source ("boundaries.json")
        todo.extend(data for data in path.parent.glob("*.json") if f'"{data.name}"' in source)
    return sorted(seen)


def code_hash(*modules: str, files=(), scripts=()) -> str:
    """sha256 over the content of `modules` (with what they import), of `scripts` (entry points outside the
    package, with the package modules they import) and of other `files`."""
    scripts = [Path(s) for s in scripts]
    modules = (*modules, *(name for script in scripts for name in script_imports(script)))
    paths = [*module_files(*modules), *scripts, *map(Path, files)]
    # A plan hashes the same few scripts and modules for every job: each set is hashed once per content of its
    # files (their modification times and sizes stand for it), not once per job.
    return _hashed(tuple((path, (info := path.stat()).st_mtime_ns, info.st_size) for path in paths))


@functools.cache
def _hashed(stamped: tuple) -> str:
    digest = hashlib.sha256()
    for path, _, _ in stamped:
        digest.update(str(path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path.name).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
