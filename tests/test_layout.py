"""The package's layout as its docstring states it: parts that import only the parts before them, no import
cycle (imports inside functions included), and no module, rule file or template past about 300 lines."""

from pathlib import Path

from conftest import ROOT
from grpo_equivalence.runtime import codedeps

# The parts in the order they may import each other (grpo_equivalence/__init__.py says what each holds)
ORDER = ("runtime", "analysis", "training", "study", "checks", "report", "cli")
LIMIT = 300  # lines of a module, a rule file or a template


def graph() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports, at top level or inside functions."""
    found = {}
    for path in sorted(codedeps.PACKAGE.rglob("*.py")):
        module = codedeps._module_of(path)
        found[module] = {codedeps._module_of(codedeps._file_of(name)) for name in codedeps._imports(path)} - {module}
    return found


def part(module: str) -> str | None:
    names = module.split(".")
    return names[1] if len(names) > 1 else None


def test_every_module_is_in_a_part_and_imports_no_later_part():
    modules = graph()
    assert {part(m) for m in modules} - {None} == set(ORDER)
    climbing = [(m, d) for m, deps in modules.items() for d in deps
                if part(d) in ORDER and ORDER.index(part(d)) > ORDER.index(part(m))]
    assert not climbing, climbing


def test_no_import_cycle():
    modules, state, cycles = graph(), {}, []

    def visit(module, path):
        state[module] = "open"
        for dep in sorted(modules[module]):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep] if dep in path else [module, dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = "done"

    for module in modules:
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_no_file_past_the_limit():
    files = [*codedeps.PACKAGE.rglob("*.py"), *(ROOT / "workflow").rglob("*.smk"), *(ROOT / "workflow").rglob("*.py"),
             ROOT / "Snakefile", *(ROOT / "report_templates").rglob("*.j2")]
    long = {str(Path(f).relative_to(ROOT)): n for f in files if (n := len(Path(f).read_text().splitlines())) > LIMIT}
    assert not long, long


BENCHMARKS = ROOT / "benchmarks"


def _imported_names(path: Path) -> set[str]:
    """Top-level names of every module `path` imports, at top level or inside functions."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_benchmark_imports_another_only_the_shared_helpers():
    scripts = {path.stem: path for path in BENCHMARKS.glob("*.py")}
    importing = {name: sorted(_imported_names(path) & (set(scripts) - {"benchlib"}))
                 for name, path in scripts.items()}
    assert not {name: found for name, found in importing.items() if found}, importing
    assert _imported_names(scripts["benchlib"]).isdisjoint(scripts)


def test_the_benchmarks_catalogue_lists_every_file_there():
    catalogue = (BENCHMARKS / "README.md").read_text()
    missing = [path.name for path in BENCHMARKS.iterdir() if path.is_file() and path.name != "README.md"
               and f"`{path.name}`" not in catalogue]
    assert not missing, f"benchmarks/README.md does not list {missing}"


def test_every_finding_has_its_script_its_output_and_a_row_in_the_findings_page():
    """findings/NAME/ is one defect: reproduce.py (runs without the workflow: imports nothing of the package), at
    least one committed output-WHERE.txt with the exit status the script gave (an rc= line; 1: the defect present), and
    a row of docs/findings.md naming the script."""
    page = (ROOT / "docs/findings.md").read_text()
    folders = sorted(p for p in (ROOT / "findings").iterdir() if p.is_dir())
    assert folders
    for folder in folders:
        script = folder / "reproduce.py"
        assert script.is_file(), f"{folder.name}: no reproduce.py"
        assert "grpo_equivalence" not in script.read_text(), f"{folder.name}: the script imports the workflow's package"
        outputs = sorted(folder.glob("output-*.txt"))
        assert outputs, f"{folder.name}: no committed output"
        for output in outputs:
            assert any(line.startswith("rc=") for line in output.read_text().splitlines()), f"{output}: no exit status"
        assert f"`findings/{folder.name}/reproduce.py`" in page, f"docs/findings.md has no row for {folder.name}"
