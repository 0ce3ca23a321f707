"""The trackers a study's grpo.report_to names, and the package each needs (transformers' integration for it
raises only once the trainer is built: after a model load, a GPU lease and, locally, every other job's start).
Checked before any job where the workflow runs locally (session.check_runnable) and at each train job's start."""

import importlib.util

# report_to's name -> the packages transformers' integration imports (any one of them will do)
NEEDS = {
    "wandb": ("wandb",), "tensorboard": ("tensorboard", "tensorboardX"), "trackio": ("trackio",),
    "mlflow": ("mlflow",), "comet_ml": ("comet_ml",), "clearml": ("clearml",), "neptune": ("neptune",),
    "dvclive": ("dvclive",), "swanlab": ("swanlab",), "codecarbon": ("codecarbon",), "azure_ml": ("azureml",),
    "dagshub": ("dagshub",), "flyte": ("flytekit",),
}


def named(config: dict) -> list[str]:
    """The trackers of `config`'s grpo.report_to ("none" and "all", whatever is installed, name none)."""
    report_to = (config.get("grpo") or {}).get("report_to", "none")
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    return [name for name in names if name not in ("none", "all")]


def problems(config: dict) -> list[str]:
    """One line per named tracker whose package is not installed here, with the fix."""
    found = []
    for name in named(config):
        modules = NEEDS.get(name, ())
        if modules and not any(importlib.util.find_spec(module) for module in modules):
            found.append(f"grpo.report_to names {name}, whose package ({' or '.join(modules)}) is not installed "
                         f"where the train jobs run: pip install {modules[0]}, or drop {name} from report_to")
    return found
