# A diagnostic for one device call (not part of the workflow): with SQUARE_PROBE=FILE and this folder on PYTHONPATH, a
# trainer check records every decision Unsloth's GRPO code makes on "hidden states or logits?"
# (_unsloth_grpo_returns_hidden_states): the tensor it decided on, the token ids beside it in the caller, the output
# layer, the decision, the marker signal, whether the adapter was off, and the wrapper chain's markers; saved to FILE.
import importlib.abc
import importlib.util
import inspect
import os
import sys

RECORDS = []


def _markers(model):
    chain, seen = [], model
    for _ in range(6):
        if seen is None:
            break
        chain.append({"type": type(seen).__name__,
                      "supports": getattr(seen, "__UNSLOTH_SUPPORTS_RETURN_HIDDEN_STATES__", None),
                      "class_supports": getattr(type(seen), "__UNSLOTH_SUPPORTS_RETURN_HIDDEN_STATES__", None),
                      "wrapped": getattr(seen, "_unsloth_grpo_hidden_states_forward_wrapped", None),
                      "degraded": getattr(seen, "_unsloth_grpo_hidden_states_degraded", None)})
        seen = getattr(seen, "base_model", None) if hasattr(seen, "get_base_model") else getattr(seen, "model", None)
    return chain


def _install(trainer):
    import torch

    for module in list(sys.modules.values()):
        try:  # some modules answer any attribute (torch.classes): only a Python function is Unsloth's
            original = vars(module).get("_unsloth_grpo_returns_hidden_states")
        except TypeError:
            continue
        if not inspect.isfunction(original) or getattr(original, "_probe", False):
            continue

        def wrapped(model, tensor, lm_head, _original=original, _module=module):
            decision = _original(model, tensor, lm_head)
            caller = sys._getframe(1)
            local = caller.f_locals
            ids = local.get("_pk_ids") if tensor is local.get("_pk_out") else local.get("completion_input_ids_chunk")
            signal = getattr(_module, "_unsloth_grpo_hidden_states_signal", None)
            lora = next((m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "disable_adapters")), None)
            if len(RECORDS) < 12:
                RECORDS.append({
                    "module": _module.__name__, "caller": caller.f_code.co_name, "line": caller.f_lineno,
                    "decision": bool(decision), "signal": signal(model) if signal else "n/a",
                    "adapters_disabled": getattr(lora, "disable_adapters", None), "grad": torch.is_grad_enabled(),
                    "shape": tuple(tensor.shape), "tensor": tensor.detach().float().cpu(),
                    "ids": None if ids is None else ids.detach().cpu(), "head": lm_head.detach().float().cpu(),
                    "markers": _markers(model)})
            return decision

        wrapped._probe = True
        module._unsloth_grpo_returns_hidden_states = wrapped


def _patch(module):
    import torch

    use_batch, check = module._use_batch, module.check

    def probed_use_batch(trainer, batch):
        _install(trainer)
        return use_batch(trainer, batch)

    def probed_check(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        finally:
            torch.save(RECORDS, os.environ["SQUARE_PROBE"])

    module._use_batch, module.check = probed_use_batch, probed_check


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "grpo_equivalence.checks.trainer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("SQUARE_PROBE"):
    sys.meta_path.insert(0, _Finder())
