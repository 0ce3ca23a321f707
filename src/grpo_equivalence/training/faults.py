"""Faults put in on purpose, to show that the verdicts catch a backend that samples or trains wrongly.

Any backend runs with one fault when it is named `BACKEND+FAULT` in a study's `backends` (`hf+temperature_up`):
the same loader and rollout path, with one thing changed once the trainer exists. Sampling faults change
only what the sampler sees (TRL's GenerationConfig for transformers' paths, its VLLMGeneration's settings for
vLLM's), never the settings the trainer scores and trains with, which is what a buggy rollout engine does.

The same suffix also names a configuration (CONFIGURATIONS), `BACKEND+CONFIGURATION` (`native+liger`): the backend
with GRPOConfig settings of its own, meant to compute the same step faster or in less memory, so that a study can
judge it against the same backend without them. A configuration is not a fault: the report does not mark it.
"""

import contextlib

from . import vllm_kernel

SEPARATOR = "+"
# Each fault and what it does
FAULTS = {
    "temperature_up": "the sampler's temperature x1.1",
    "temperature_down": "the sampler's temperature x0.9",
    "no_min_p": "the sampler ignores min_p",
    "no_top_k": "the sampler ignores top_k",
    "drop_weakest": "the sampler drops the weakest token top_p needs where min_p left at most top_k (vLLM 0.26's "
                    "top-k/top-p kernel, on transformers' generate())",
    "fp8_rollout": "the rollout's weight matrices quantised to float8 (e4m3, a scale per matrix): a correct sampler "
                   "on perturbed logits, the numerics fault",
    "stale_policy": "completions sampled from the policy of one step before",
    "bf16_rollout": "adapters rounded to bfloat16 for the rollout",
    "no_kl": "the KL term dropped from the loss (still measured): a trainer-side control",
    "loss_x2": "the loss doubled, and its gradient with it: a trainer-side fault",
}
TEMPERATURE_FACTOR = {"temperature_up": 1.1, "temperature_down": 0.9}
# Each configuration: what it is, the GRPOConfig settings it puts over the study's `grpo` for that backend alone,
# whether its adapters read the model's own bfloat16 input (backends.base.share_adapter_inputs), and the backend
# options it sets over the study's `backend_options` (only a backend that has them takes it). They apply to the
# TRL + PEFT stack's backends: Unsloth brings kernels and adapters of its own.
CONFIGURATIONS = {
    "liger": {"what": "TRL's Liger kernels (grpo.use_liger_kernel: Liger's RMSNorm, SwiGLU and RoPE as Triton "
                      "kernels, and TRL's chunked log-probabilities; CUDA GPUs only)",
              "grpo": {"use_liger_kernel": True}, "shared_inputs": False},
    "shared_inputs": {"what": "PEFT's adapters reading the model's bfloat16 input under autocast instead of a float32 "
                              "copy each (the same numbers; one saved input for the adapters of one input)",
                      "grpo": {}, "shared_inputs": True},
    "lean": {"what": "both: TRL's Liger kernels, and PEFT's adapters reading the model's bfloat16 input under autocast",
             "grpo": {"use_liger_kernel": True}, "shared_inputs": True},
    "unmerged": {"what": "the decoder reading the trainer's weights and adapters where they lie, each adapter added as "
                         "PEFT adds it, instead of a merged copy (backend_options unmerged_adapters; native only)",
                 "grpo": {}, "shared_inputs": False, "options": {"unmerged_adapters": True}},
    # Not faster: the same engine with vLLM's sort-based top-k/top-p filter, so that a study can judge trl_vllm with
    # and without its Triton kernel side by side, paired by seed (the kernel's defect: docs/findings.md)
    "exact_top_p": {"what": "vLLM's sort-based top-k/top-p filter at every batch size instead of its Triton kernel "
                            "(backend_options exact_top_p; trl_vllm only)",
                    "grpo": {}, "shared_inputs": False, "options": {"exact_top_p": True}},
}
# The faults that change what the sampler draws from the same logits, as the settings a faulty sampler uses: the
# rollout check computes from them what it can detect (grpo_equivalence.checks.power)
SAMPLING = ("temperature_up", "temperature_down", "no_min_p", "no_top_k", "drop_weakest")
# The faults that change the logits the sampler draws from, not how it draws: its numerics
NUMERICS = ("fp8_rollout",)
# Faults a shared session puts in and takes out around one rollout check (sampling_fault)
ROLLOUT = SAMPLING + NUMERICS
# The marker of drop_weakest's rule among a sampler's settings (sampler_settings): not a setting of any sampler
RULE, DROP_WEAKEST = "_rule", "drop_weakest"
# The sampler setting each sampling fault changes
SAMPLER_KEY = {"temperature_up": "temperature", "temperature_down": "temperature", "no_min_p": "min_p",
               "no_top_k": "top_k"}
# beta this small drops the KL term from the loss while TRL still computes and logs the KL (it skips both at 0)
NEGLIGIBLE_BETA = 1e-12


def split(name: str) -> tuple[str, str | None]:
    """"hf+no_min_p" -> ("hf", "no_min_p"); "hf" -> ("hf", None)."""
    base, _, fault = name.partition(SEPARATOR)
    return base, fault or None


def fault_of(name: str) -> str | None:
    """"hf+no_min_p" -> "no_min_p"; "hf" and "native+liger" (a configuration) -> None."""
    suffix = split(name)[1]
    return None if suffix in CONFIGURATIONS else suffix


def configuration_of(name: str) -> str | None:
    """"native+liger" -> "liger"; "native" and "hf+no_min_p" (a fault) -> None."""
    suffix = split(name)[1]
    return suffix if suffix in CONFIGURATIONS else None


def grpo_settings(name: str, grpo: dict) -> dict:
    """The study's `grpo` settings as backend `name` trains with them: its configuration's put over them."""
    configuration = configuration_of(name)
    return {**grpo, **CONFIGURATIONS[configuration]["grpo"]} if configuration else grpo


def check(fault: str) -> None:
    if fault not in FAULTS:
        raise KeyError(f"unknown fault {fault!r}; choose among {', '.join(FAULTS)} (as BACKEND+FAULT), or a "
                       f"configuration among {', '.join(CONFIGURATIONS)} (as BACKEND+CONFIGURATION)")


def sampler_settings(fault: str, settings: dict) -> dict:
    """The sampling settings (temperature, top_k, top_p, min_p) a sampler with sampling `fault` uses."""
    if fault in TEMPERATURE_FACTOR:
        return {**settings, "temperature": (settings.get("temperature") or 1.0) * TEMPERATURE_FACTOR[fault]}
    if fault == "no_min_p":
        return {**settings, "min_p": None}
    if fault == "no_top_k":
        return {**settings, "top_k": None}
    if fault == DROP_WEAKEST:
        return {**settings, RULE: DROP_WEAKEST}
    raise KeyError(f"{fault!r} is not a sampling fault; sampling faults: {', '.join(SAMPLING)}")


def _set_sampler(trainer, **values) -> list[str]:
    """Sampling settings as the rollout sees them, not as the trainer scores with them. Returns what changed."""
    changed = []
    vllm = getattr(trainer, "vllm_generation", None)
    if vllm is not None:
        for key, value in values.items():
            setattr(vllm, key, value(getattr(vllm, key)) if callable(value) else value)
            changed.append(f"vllm_generation.{key}")
    generation = getattr(trainer, "generation_config", None)
    if generation is not None:
        for key, value in values.items():
            new = value(getattr(generation, key)) if callable(value) else value
            setattr(generation, key, new)
            # TRL also passes these as keyword arguments over the model's own generation config
            if isinstance(getattr(trainer, "generation_kwargs", None), dict) and key in trainer.generation_kwargs:
                trainer.generation_kwargs[key] = new
            changed.append(f"generation.{key}")
    if not changed:
        raise RuntimeError("cannot inject a sampling fault: the trainer has neither a generation_config nor a "
                           "vllm_generation (a TRL version this project does not know); use trl 1.15 or 1.16")
    return changed


@contextlib.contextmanager
def sampling_fault(trainer, fault: str | None):
    """`fault` (a rollout fault, ROLLOUT, or None for none) in a built trainer's rollout for the block, and the
    rollout as it was back after it: several rollout checks then share one trainer, and a vLLM backend one engine
    (whose start takes longer than the check). Yields what it changed."""
    if fault is None:
        yield []
        return
    if fault not in ROLLOUT:
        raise ValueError(f"{fault!r} cannot be put into a shared trainer and taken out again; only the rollout faults "
                         f"can ({', '.join(ROLLOUT)}): check a backend with it in a session of its own")
    if fault == DROP_WEAKEST:
        with vllm_kernel.dropping_weakest_in_generate(trainer):
            yield [f"fault.{fault}"]
        return
    if fault in NUMERICS:
        own = trainer._generate_single_turn
        try:
            yield inject(trainer, fault)
        finally:
            trainer._generate_single_turn = own
        return
    key = SAMPLER_KEY[fault]
    holders = [h for h in (getattr(trainer, "vllm_generation", None), getattr(trainer, "generation_config", None))
               if h is not None]
    own = [(holder, getattr(holder, key)) for holder in holders]
    kwargs = getattr(trainer, "generation_kwargs", None)
    own_kwargs = dict(kwargs) if isinstance(kwargs, dict) else None
    try:
        yield inject(trainer, fault)
    finally:
        for holder, value in own:
            setattr(holder, key, value)
        if own_kwargs is not None:
            kwargs.clear()
            kwargs.update(own_kwargs)


def _trainable(trainer) -> list:
    return [p for p in trainer.model.parameters() if p.requires_grad]


def _wrap_rollout(trainer, weights_for_rollout, held=_trainable) -> None:
    """Around each generation call, the weights `held(trainer)` names (the trainable ones by default) hold
    `weights_for_rollout(trainer, weights)` (a list of tensors, or None to leave them), and get their own values back
    afterwards: what the rollout sees, not what trains."""
    import torch

    generate = trainer._generate_single_turn

    def faulty(*args, **kwargs):
        params = held(trainer)
        swapped = weights_for_rollout(trainer, params)
        if swapped is None:
            return generate(*args, **kwargs)
        with torch.no_grad():
            own = [p.detach().clone() for p in params]
            for p, w in zip(params, swapped, strict=True):
                p.copy_(w)
        try:
            return generate(*args, **kwargs)
        finally:
            with torch.no_grad():
                for p, w in zip(params, own, strict=True):
                    p.copy_(w)

    trainer._generate_single_turn = faulty


def _stale(trainer, params):
    """The weights of the step before: each step's first generation call keeps the weights it starts from."""
    snapshots = trainer.__dict__.setdefault("_fault_snapshots", {})
    step = trainer.state.global_step
    if step not in snapshots:
        snapshots[step] = [p.detach().clone() for p in params]
        snapshots.pop(step - 2, None)
    return snapshots.get(step - 1)


def _bf16(trainer, params):
    import torch

    return [p.detach().to(torch.bfloat16).to(p.dtype) for p in params]


def fp8(weight):
    """`weight` quantised to float8 e4m3 with one scale for the matrix (its largest magnitude at e4m3's largest,
    448), as an FP8 rollout holds it, and back in its own dtype."""
    import torch

    scale = weight.detach().abs().amax().float().clamp_min(1e-12) / 448.0
    return ((weight.detach().float() / scale).to(torch.float8_e4m3fn).float() * scale).to(weight.dtype)


def _wrap_rollout_matrices(trainer, quantise) -> None:
    """Around each generation call every weight matrix of the model (the base model's, the adapters', the output
    layer's) holds quantise(matrix), and its own values after: the rollout's logits perturbed, its sampler as it
    is. A rollout that keeps a merged copy of the weights (native) or an engine of its own (vLLM) is refused."""
    if getattr(trainer, "vllm_generation", None) is not None:  # its engine loads the weights once a step
        raise ValueError("fp8_rollout changes the weights the trainer's model holds around each generation call; a "
                         "vLLM engine holds a copy of its own: use hf, hf_static, cb_paged or native")
    _wrap_rollout(trainer, lambda trainer, matrices: [quantise(p) for p in matrices],
                  held=lambda trainer: [p for p in trainer.model.parameters() if p.dim() == 2])


def inject(trainer, fault: str) -> list[str]:
    """Puts `fault` into a built GRPOTrainer; returns what it changed, as the report names settings."""
    check(fault)
    if fault in TEMPERATURE_FACTOR:
        return _set_sampler(trainer, temperature=lambda t: t * TEMPERATURE_FACTOR[fault])
    if fault == "no_min_p":
        return _set_sampler(trainer, min_p=lambda _: 0.0 if getattr(trainer, "vllm_generation", None) else None)
    if fault == "no_top_k":
        # vLLM's "no top-k" is -1; transformers' is 0 (None would fall back to GenerationConfig's default 50)
        return _set_sampler(trainer, top_k=lambda _: -1 if getattr(trainer, "vllm_generation", None) else 0)
    if fault == "stale_policy":
        _wrap_rollout(trainer, _stale)
        return ["fault.stale_policy"]
    if fault == "bf16_rollout":
        _wrap_rollout(trainer, _bf16)
        return ["fault.bf16_rollout"]
    if fault == "fp8_rollout":
        _wrap_rollout_matrices(trainer, fp8)
        return ["fault.fp8_rollout"]
    if fault == DROP_WEAKEST:  # for a whole run: this process's generate() filters so from here on
        vllm_kernel.install_in_generate(trainer)
        return [f"fault.{fault}"]
    if fault == "no_kl":
        trainer.beta = NEGLIGIBLE_BETA
        return ["fault.beta"]
    if fault == "loss_x2":
        compute_loss = trainer.compute_loss

        def doubled(*args, **kwargs):
            out = compute_loss(*args, **kwargs)
            return (2 * out[0], *out[1:]) if isinstance(out, tuple) else 2 * out

        trainer.compute_loss = doubled
        return ["fault.loss_x2"]
    raise AssertionError(fault)
