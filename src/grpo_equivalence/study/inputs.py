"""The study's inputs on this machine: which files of the user's own a run reads (the train rule's inputs, the run
cache's content), whether a job may use the network, and what can be checked of them before any job."""

from pathlib import Path

from ..runtime.paths import PROJECT
from .config import RANDOM, TINY


def architecture_path(value: str) -> Path:
    """A random_model.architecture file: as given (absolute, or from the working directory), else in the project."""
    path = Path(value).expanduser()
    return path if path.is_absolute() or path.exists() else PROJECT / value


def random_model_problems(section) -> list[str]:
    if not isinstance(section, dict) or not isinstance(section.get("architecture"), str):
        return ['random_model: model is "random" but random_model.architecture is not set; add the section (see '
                'studies/speed-4b.yaml)']
    from ..training.random_model import load_architecture

    path = architecture_path(section["architecture"])
    try:
        architecture = load_architecture(path)
    except FileNotFoundError:
        return [f"random_model.architecture: {section['architecture']} not found (looked in the working directory "
                f"and {PROJECT}); give a config.json such as studies/architectures/qwen3-4b.json"]
    except ValueError as e:
        return [f"random_model.architecture: {e}"]
    size = section.get("tokenizer_size")
    if isinstance(size, int) and size > architecture["vocab_size"]:
        return [f"random_model.tokenizer_size: {size} tokens do not fit the architecture's {architecture['vocab_size']} "
                f"embedding rows; lower it to the real tokenizer's size"]
    return []


# load_dataset builders that read local files named by dataset.data_files
FILE_BUILDERS = ("json", "csv", "parquet", "text", "arrow")


def _looks_like_a_path(model: str) -> bool:
    """A hub id is `name` or `org/name`; anything else (absolute, ./, ~, more parts) is meant as a folder."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or Path(model).exists()


CHAT_TEMPLATE_STUDY = "study"  # chat_template: the original study's answer format (answer_format.CHAT_TEMPLATE)


def chat_template_file(value: str, bases=()) -> Path | None:
    """The file a chat_template setting names, if it names one (relative to `bases`, else as given)."""
    path = Path(value).expanduser()
    for candidate in ([path] if path.is_absolute() else [Path(b) / path for b in bases] + [path]):
        if candidate.is_file():
            return candidate.resolve()
    return None


def is_local(config: dict) -> bool:
    """Model and data come from this machine (the tiny study, a model folder, local data files): no job
    needs the network, so none may use it."""
    model, dataset = config["model"], config["dataset"]
    model_local = model in (TINY, RANDOM) or Path(model).expanduser().exists()
    data_local = dataset["path"] == TINY or Path(dataset["path"]).expanduser().exists() or (
        dataset["path"] in FILE_BUILDERS and bool(dataset.get("data_files")))
    return model_local and data_local


def _files_under(path: Path) -> list[Path]:
    """A file, or every file in a folder (not in hidden folders such as .git or .cache)."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                                                                           p.relative_to(path).parts[:-1]))


def local_input_files(config: dict) -> list[str]:
    """The user's own files that a run reads: their model folder, their data set's folder or files. The train
    rule takes them as inputs, so that Snakemake reruns a job whose model or data changed, and the run cache keys
    on their content. (The built tiny and random models and the tiny data are outputs of rules already.)"""
    found = []
    model = config["model"]
    if model not in (TINY, RANDOM) and Path(model).expanduser().exists():
        found += _files_under(Path(model).expanduser())
    dataset = config["dataset"]
    if dataset["path"] != TINY and Path(dataset["path"]).expanduser().exists():
        found += _files_under(Path(dataset["path"]).expanduser())
    if dataset["path"] in FILE_BUILDERS:
        import glob

        files = dataset.get("data_files") or []  # a path or a pattern (the schema takes one string)
        for name in [files] if isinstance(files, str) else files:
            if "://" not in name:
                found += sorted(Path(p) for p in glob.glob(str(Path(name).expanduser())) if Path(p).is_file())
    return [str(p) for p in dict.fromkeys(found)]


def _not_utf8(path: Path) -> str | None:
    """Where a text file stops being UTF-8 (line and byte), or None: load_dataset would fail only in a train job."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        return f"is not UTF-8 at line {line} (byte {e.start}: {data[e.start:e.start + 1]!r})"
    return None


def data_rows(config: dict) -> int | None:
    """How many problems the study's local data files hold (json lines: non-empty lines; csv: rows after the
    header); None where that cannot be known here (the tiny data set, a hub data set, a pattern, another layout)."""
    dataset = config.get("dataset") or {}
    files = dataset.get("data_files")
    if dataset.get("path") not in ("json", "csv") or not files:
        return None
    if _local_data(dataset)[0]:  # a file of other problems: those are said, not its size
        return None
    total = 0
    for name in [files] if isinstance(files, str) else files:
        path = Path(name).expanduser()
        if any(c in name for c in "*?[") or "://" in name or not path.is_file():
            return None
        lines = [line for line in path.read_text(encoding="utf-8-sig", errors="replace").splitlines() if line.strip()]
        if dataset["path"] == "json" and not (lines and lines[0].lstrip().startswith("{")):
            return None
        total += len(lines) - (1 if dataset["path"] == "csv" else 0)
    return total


def _local_data(dataset: dict) -> tuple[list[str], set[str] | None]:
    """The data files of a file builder checked (there, not empty, with the prompt column, its first prompt text or
    chat messages, json lines and csv read), and the columns every file has (None where one cannot be read here)."""
    from ..training.answer_format import message_problem

    files = dataset.get("data_files")
    if not files:
        return [f'dataset.data_files: the "{dataset["path"]}" builder reads local files; name them in '
                f'dataset.data_files'], None
    problems, columns, prompt_col = [], [], dataset.get("prompt_column", "prompt")
    for name in [files] if isinstance(files, str) else files:
        path = Path(name).expanduser()
        if any(c in name for c in "*?[") or "://" in name:
            columns.append(None)  # a pattern or remote URL: load_dataset resolves it
            continue
        if not path.is_file():
            problems.append(f"dataset.data_files: {name} does not exist; fix the path (relative to the folder snakemake "
                            f"runs in)")
            continue
        if (problem := _not_utf8(path)) is not None:
            problems.append(f"dataset.data_files: {name} {problem}; save it as UTF-8 text")
            continue
        # utf-8-sig: a byte-order mark (as spreadsheet programs save CSV) is not part of the first column's name
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            first = next((line for line in f if line.strip()), None)
        if first is None:
            problems.append(f"dataset.data_files: {name} is empty; it needs one problem per line (or row)")
            continue
        row = None
        if dataset["path"] == "json" and first.lstrip().startswith("{"):
            import json

            try:
                row = json.loads(first)
            except ValueError:
                columns.append(None)
                continue  # a JSON array file or another layout: load_dataset will say
            present = set(row)
        elif dataset["path"] == "csv":
            import csv

            with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
                rows = (row for row in csv.reader(f) if any(cell.strip() for cell in row))
                present, data_row = set(next(rows, [])), next(rows, None)
            if data_row is None:  # load_dataset would only fail after the model is loaded
                problems.append(f"dataset.data_files: {name} has a header but no rows; it needs one problem per row")
                continue
        else:
            columns.append(None)
            continue
        columns.append(present)
        if prompt_col not in present:
            problems.append(f"dataset: {name} has no column {prompt_col!r} (columns: {', '.join(sorted(present))}); "
                            f"set dataset.prompt_column")
        elif row is not None and (problem := message_problem(row[prompt_col])):
            problems.append(f"dataset: {name}, column {prompt_col!r} of its first row: {problem}")
    known = None if not columns or None in columns else set.intersection(*columns)
    return problems, known


def data_columns(config: dict) -> set[str] | None:
    """The columns the train jobs' data set will have (training.data.load_problems), where they can be known before
    any job: the tiny data set's, or what local json lines or csv files have; None for a hub data set or a pattern."""
    from ..training import tiny
    from ..training.data import columns_after_loading

    dataset = config["dataset"]
    if dataset["path"] == TINY:
        return columns_after_loading(tiny.COLUMNS, dataset)
    if dataset["path"] in FILE_BUILDERS:
        problems, columns = _local_data(dataset)
        return columns_after_loading(columns, dataset) if columns is not None and not problems else None
    return None


def input_problems(config: dict) -> list[str]:
    """What can be checked of the model and data before any job, on this machine: local paths and files."""
    problems = []
    model = config["model"]
    if model not in (TINY, RANDOM) and _looks_like_a_path(model):
        path = Path(model).expanduser()
        if not path.is_dir():
            problems.append(f"model: {model} is not a folder; give a model folder (with config.json) or a hub id "
                            f"such as unsloth/Qwen3-4B-Base")
        elif not (path / "config.json").is_file():
            problems.append(f"model: {model} has no config.json; give the folder that save_pretrained wrote")
    dataset = config["dataset"]
    if dataset["path"] in FILE_BUILDERS:
        problems += _local_data(dataset)[0]
    elif dataset["path"] != TINY and dataset["path"].startswith(("/", ".", "~")) and not Path(dataset["path"]).expanduser().exists():
        problems.append(f"dataset.path: {dataset['path']} does not exist; give a data set folder or file, a hub id, or "
                        f"a builder (json, csv, parquet) with dataset.data_files")
    return problems

