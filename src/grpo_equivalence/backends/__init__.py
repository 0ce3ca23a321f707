"""The rollout backends. One module per backend, named after it, defining `BACKEND`.

Adding a backend is adding one module here: it is found by its file name, so no list elsewhere needs
editing. Modules import nothing heavy at import time, so that planning the DAG works on a machine
without the backend's packages (a cluster's login node).
"""

import importlib
import pkgutil

from .base import Backend, BackendUnavailable, LoadSpec, Loaded

__all__ = ["Backend", "BackendUnavailable", "LoadSpec", "Loaded", "get", "names", "module_file"]


def names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_") and m.name != "base")


def get(name: str) -> Backend:
    if name not in names():
        raise KeyError(f"unknown backend {name!r}; choose among {', '.join(names())}")
    return importlib.import_module(f"{__name__}.{name}").BACKEND


def module_file(name: str) -> str:
    """The file that defines backend `name` (its train jobs depend on it)."""
    return importlib.import_module(f"{__name__}.{name}").__file__
