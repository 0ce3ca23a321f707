"""The rollout backends. One module per backend, named after it, defining `BACKEND`.

Adding a backend is adding one module here: it is found by its file name, so no list elsewhere needs
editing. Modules import nothing heavy at import time, so that planning the DAG works on a machine
without the backend's packages (a cluster's login node).

`BACKEND+FAULT` (`hf+no_min_p`) is that backend with one fault injected (grpo_equivalence.faults): what the
verdicts must catch.
"""

import importlib
import pkgutil

from .. import faults
from .base import STACK_REFERENCES, Backend, BackendUnavailable, LoadSpec, Loaded, WithFault

__all__ = ["STACK_REFERENCES", "Backend", "BackendUnavailable", "LoadSpec", "Loaded", "get", "names", "module_file",
           "module_name", "stack"]


def names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_") and m.name != "base")


def get(name: str) -> Backend:
    base, fault = faults.split(name)
    if base not in names():
        raise KeyError(f"unknown backend {base!r}; choose among {', '.join(names())}")
    backend = importlib.import_module(f"{__name__}.{base}").BACKEND
    if fault is None:
        return backend
    faults.check(fault)
    return WithFault(backend, fault)


def stack(name: str) -> str | None:
    """The trainer stack backend `name` trains through (None: not a backend of this project)."""
    try:
        return get(name).stack
    except KeyError:
        return None


def module_name(name: str) -> str:
    """The module that defines backend `name` (its train jobs depend on it), a fault's base backend's."""
    return f"{__name__}.{faults.split(name)[0]}"


def module_file(name: str) -> str:
    """The file that defines backend `name`."""
    return importlib.import_module(module_name(name)).__file__
