"""The rollout backends. One module per backend, named after it, defining `BACKEND`.

Adding a backend is adding one module here: it is found by its file name, so no list elsewhere needs
editing. Modules import nothing heavy at import time, so that planning the DAG works on a machine
without the backend's packages (a cluster's login node). An installed package adds a backend without
editing this project, through the entry point group `grpo_equivalence.backends` (name = module:object,
the object a Backend; README, "Backends from outside").

`BACKEND+FAULT` (`hf+no_min_p`) is that backend with one fault injected (grpo_equivalence.training.faults): what the
verdicts must catch; `BACKEND+CONFIGURATION` (`native+liger`) the same backend with a configuration's GRPOConfig
settings (faults.CONFIGURATIONS), which the session puts over the study's.
"""

import functools
import importlib
import importlib.util
import pkgutil

from .. import faults
from .base import STACK_REFERENCES, Backend, BackendUnavailable, Loaded, LoadSpec, WithFault

__all__ = ["STACK_REFERENCES", "Backend", "BackendUnavailable", "LoadSpec", "Loaded", "get", "names", "module_file",
           "module_name", "code_of", "stack", "trainer_check_backend", "ENTRY_POINTS"]


ENTRY_POINTS = "grpo_equivalence.backends"


def _builtin() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_") and m.name != "base")


@functools.lru_cache(maxsize=1)
def _plugins() -> dict:
    """Backends that installed packages add: {name: entry point}, the project's own names taking precedence."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINTS) if ep.name not in _builtin()}


def names() -> list[str]:
    return sorted([*_builtin(), *_plugins()])


def _load_plugin(name: str) -> Backend:
    entry = _plugins()[name]
    try:
        backend = entry.load()
    except Exception as error:  # a broken plugin names itself rather than stopping with its traceback
        raise BackendUnavailable(f"backend {name!r} (entry point {entry.value} of {ENTRY_POINTS}) cannot be loaded: "
                                 f"{type(error).__name__}: {error}; fix or uninstall the package that adds it") from None
    missing = [a for a in ("load", "grpo_overrides", "prepare_trainer", "check_runnable", "options", "stack")
               if not hasattr(backend, a)]
    if missing or getattr(backend, "name", None) != name:
        raise BackendUnavailable(f"backend {name!r} ({entry.value}) is not a grpo_equivalence.training.backends.Backend named "
                                 f"{name!r} (missing: {', '.join(missing) or 'none'}; its name: "
                                 f"{getattr(backend, 'name', None)!r}); subclass Backend and give it this name")
    return backend


def get(name: str) -> Backend:
    base, fault = faults.split(name)
    if base not in names():
        raise KeyError(f"unknown backend {base!r}; choose among {', '.join(names())}")
    backend = _load_plugin(base) if base in _plugins() else importlib.import_module(f"{__name__}.{base}").BACKEND
    if fault is None or fault in faults.CONFIGURATIONS:  # a configuration is the backend with other grpo settings
        return backend
    faults.check(fault)
    return WithFault(backend, fault)


def trainer_check_backend(name: str, dtype: str) -> str:
    """The backend a trainer check of `name` in `dtype` builds: `name` itself, or where its engine cannot load in that
    precision, the same trainer stack without the engine (Backend.without_engine), its fault kept."""
    backend = get(name)
    if dtype not in getattr(backend, "engine_refuses", ()):
        return name
    suffix = faults.split(name)[1]
    return backend.without_engine + (f"{faults.SEPARATOR}{suffix}" if suffix else "")


def stack(name: str) -> str | None:
    """The trainer stack backend `name` trains through (None: not a backend of this project)."""
    try:
        return get(name).stack
    except KeyError:
        return None


def module_name(name: str) -> str:
    """The module that defines backend `name` (its train jobs depend on it), a fault's base backend's."""
    base = faults.split(name)[0]
    return _plugins()[base].module if base in _plugins() else f"{__name__}.{base}"


def code_of(name: str) -> tuple[list[str], list[str]]:
    """What a job of backend `name` runs beside the workflow's own code, for its rerun trigger (codedeps): the
    project's module of a built-in backend, or the file of an installed package's."""
    module = module_name(name)
    if module.startswith(f"{__name__}."):
        return [module], []
    spec = importlib.util.find_spec(module)
    return [], [spec.origin] if spec is not None and spec.origin else []


def module_file(name: str) -> str:
    """The file that defines backend `name`."""
    return importlib.import_module(module_name(name)).__file__
