"""The trainer check: does a backend's trainer stack compute the same update as the reference's, at fixed weights and
on one fixed batch, without sampling?

One generation batch (prompts, completions and each reward function's scores) is sampled once by the reference and
saved (sample_batch). Each backend then builds its GRPOTrainer as a train job does, sets the adapter's weights from
the seed by module name (identical in every stack, and not zero: with a fresh adapter the policy is the reference
model and the KL and its gradient vanish), prepares the batch with its own _generate_and_score_completions (the
saved completions and rewards in place of sampling and scoring), computes its loss, its gradient, the clipping and
one optimizer step (check). Recorded with the same code for every stack: the per-token log-probabilities of the
policy and of the reference model (the adapter off) and the per-token KL between them. From the stack itself: the
reference model's log-probabilities its loss reads, its advantages, its loss and the KL term of its loss (its loss
with the advantages set to zero), the metrics it logs, the gradient of each trainable parameter, the clipping, the
update, the trainable parameters and their LoRA
scaling, the optimizer's parameter groups and the learning rate of each step. checks.trainer_verdict compares them.
"""

import os
import re
import time
import zlib
from pathlib import Path

from ..analysis import stats
from ..runtime import environment
from ..training import faults
from . import rollout_scoring

SCHEMA_VERSION = 1
# The adapter every stack starts from: A uniform within +-1/sqrt(fan-in) as PEFT draws it, B normal with this
# standard deviation (PEFT's B is zero). It moves the policy off the reference model by about as much as a few
# steps of training do in the tiny study, so that the KL, its term in the loss and its gradient are not zero.
ADAPTER_B_STD = 0.1
# Unsloth's models return no logits in training (it fuses the loss) unless told to
UNSLOTH_LOGITS_ENV = "UNSLOTH_RETURN_LOGITS"
# Generation batches sampled at most for one whose rewards differ within a group (sample_batch)
BATCH_TRIES = 8


def module_key(name: str) -> str | None:
    """A LoRA parameter's name without the wrappers' prefixes, the same in every stack:
    "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" -> "layers.0.self_attn.q_proj.lora_A"."""
    found = re.search(r"(layers\.\d+\..+?)\.(lora_[AB])\b", name)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def set_adapter(model, seed: int) -> dict:
    """Every LoRA matrix from the seed and its module's name (the same numbers in every stack); returns
    {module key: parameter} of the trainable parameters, and raises if one is not a LoRA matrix."""
    import torch

    params = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            key = module_key(name)
            if key is None:
                raise ValueError(f"trainable parameter {name} is not a LoRA matrix: the trainer check sets and "
                                 "compares LoRA adapters only")
            generator = torch.Generator().manual_seed(seed ^ zlib.crc32(key.encode()))
            shape = tuple(param.shape)
            if key.endswith("lora_A"):
                bound = 1.0 / max(1, shape[1]) ** 0.5
                value = (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * bound
            else:
                value = torch.randn(shape, generator=generator, dtype=torch.float64) * ADAPTER_B_STD
            param.copy_(value.to(param.dtype))
            params[key] = param
    return params


def _groups_with_signal(rewards, generations: int, weights=None) -> int:
    """How many groups' total rewards differ (their completions get advantages that are not zero): each function's
    score times its weight, summed as TRL sums them (`reward_weights`; all 1 by default)."""
    totals = (rewards if weights is None else rewards * weights).nansum(dim=1).reshape(-1, generations)
    return int((totals.max(dim=1).values > totals.min(dim=1).values).sum())


def sample_batch(config: dict, backend_name: str, *, model_path: str, dataset: dict, out: Path, log=print) -> dict:
    """One generation batch as training samples it, through `backend_name`'s rollout path (the reference's), with
    each reward function's score of each completion (TRL's reward path): the batch every stack's check uses.

    A batch whose groups all tie (every completion of a prompt scored alike) has no advantage, so no policy term
    and no policy gradient to compare: the next prompts of the data set are sampled instead, up to BATCH_TRIES
    batches; if every one ties, the last is kept and the check says the policy term is zero in every stack."""
    from ..training.session import session

    with session(config, backend_name, 1, model_path=model_path, dataset=dataset, log=log) as built:
        trainer = built.trainer
        generations = trainer.num_generations
        count = max(1, trainer.args.generation_batch_size // generations)
        tries = max(1, min(BATCH_TRIES, len(trainer.train_dataset) // count))
        for attempt in range(tries):
            first = attempt * count
            rows = [trainer.train_dataset[i] for i in range(first, first + count)]
            inputs = [row for row in rows for _ in range(generations)]
            prompts = [row["prompt"] for row in inputs]
            output = trainer._generate(prompts)
            prompt_ids, completion_ids, completions = output[0], output[1], output[3]
            ids = [list(map(int, c)) for c in completion_ids]
            rewards = trainer._calculate_rewards(inputs, prompts, completions, ids)
            signal = _groups_with_signal(rewards.float().cpu(), generations, getattr(trainer, "reward_weights", None))
            if signal:
                break
            log(f"[{backend_name}] prompts {first}..{first + count - 1}: every group's rewards tie (no advantage); "
                "sampling the next prompts")
    batch = {"schema_version": SCHEMA_VERSION, "backend": backend_name, "first_prompt": first, "prompts": count,
             "generations": generations, "groups_with_signal": signal,
             "prompt_ids": [list(map(int, p)) for p in prompt_ids], "completion_ids": ids,
             "completions": list(completions), "rewards": [[float(v) for v in row] for row in rewards.tolist()]}
    stats.write_json(out, batch)
    log(f"[{backend_name}] the trainer check's batch: prompts {first}..{first + count - 1} x {generations} "
        f"completions, {sum(map(len, ids))} completion tokens, {signal} of {count} groups with differing rewards "
        f"-> {out}")
    return batch


def _use_batch(trainer, batch: dict) -> list[dict]:
    """The trainer's generation and reward scoring replaced by the saved batch; returns the rows to prepare."""
    import torch

    generate, rewards = trainer._generate, torch.tensor(batch["rewards"], dtype=torch.float32)

    def saved_generation(prompts, *args, **kwargs):
        output = list(generate(prompts, *args, **kwargs))  # the stack's own tuple, of its own TRL version
        output[0], output[1], output[3] = batch["prompt_ids"], batch["completion_ids"], batch["completions"]
        if output[4] is not None:  # a sampler's own log-probabilities (vLLM): none for saved completions
            output[4] = [[0.0] * len(ids) for ids in batch["completion_ids"]]
        return tuple(output)

    trainer._generate = saved_generation
    trainer._calculate_rewards = lambda *args, **kwargs: rewards.to(trainer.accelerator.device)
    first = batch.get("first_prompt", 0)
    rows = [trainer.train_dataset[i] for i in range(first, first + batch["prompts"])]
    return [row for row in rows for _ in range(batch["generations"])]


def _per_token(trainer, batch: dict) -> dict:
    """Per completion token, the same code in every stack: the policy's and the reference model's log-probability
    of the saved token at the trainer's temperature, and the KL estimate TRL's loss uses (k3)."""
    import torch

    model, device = trainer.model, trainer.accelerator.device
    temperature = float(getattr(trainer, "temperature", None) or trainer.args.temperature or 1.0)
    records = [{"prompt_ids": p, "completion_ids": c} for p, c in zip(batch["prompt_ids"], batch["completion_ids"],
                                                                       strict=True)]

    def logps():
        out = []
        for logits, record in zip(rollout_scoring.forward_logits(model, records, device), records, strict=True):
            rows = torch.log_softmax(logits.float() / temperature, dim=-1)
            out.append(rows.gather(-1, torch.tensor(record["completion_ids"], device=device).unsqueeze(-1)).squeeze(-1))
        return torch.cat(out).cpu()

    was_training = model.training
    model.eval()
    previous = os.environ.get(UNSLOTH_LOGITS_ENV)
    os.environ[UNSLOTH_LOGITS_ENV] = "1"
    try:
        with torch.no_grad(), trainer.compute_loss_context_manager():
            policy = logps()
            with model.disable_adapter():
                reference = logps()
    finally:
        os.environ.pop(UNSLOTH_LOGITS_ENV) if previous is None else os.environ.update({UNSLOTH_LOGITS_ENV: previous})
        model.train(was_training)
    delta = reference - policy
    return {"policy_logps": policy, "reference_logps": reference, "kl": torch.exp(delta) - delta - 1}


def _stack_reference(prepared: dict, tokens: int):
    """The reference model's per-token log-probabilities as the stack's loss reads them (its own computation, in
    the prepared batch), in completion order; None where the stack keeps none there or in another layout."""
    ref, mask = prepared.get("ref_per_token_logps"), prepared.get("completion_mask")
    if ref is None or mask is None or tuple(ref.shape) != tuple(mask.shape):
        return None
    values = ref.detach().float()[mask.bool()].cpu()
    return values if values.numel() == tokens else None


def _loss(trainer, prepared: dict, zero_advantages: bool = False):
    import torch

    inputs = dict(prepared)
    if zero_advantages:
        inputs["advantages"] = torch.zeros_like(prepared["advantages"])
    with trainer.compute_loss_context_manager():
        return trainer.compute_loss(trainer.model, inputs)


def _setup(trainer, params: dict, max_steps: int) -> dict:
    """What the stack trains and how: trainable parameters, LoRA scaling, optimizer groups, learning rates."""
    scaling = sorted({float(v) for m in trainer.model.modules() if isinstance(getattr(m, "scaling", None), dict)
                      for v in m.scaling.values()})
    optimizer, scheduler = trainer.optimizer, trainer.lr_scheduler
    groups = [{"lr": g.get("initial_lr", g["lr"]), "weight_decay": g.get("weight_decay"), "eps": g.get("eps"),
               "betas": list(g["betas"]) if "betas" in g else None, "parameters": len(g["params"]),
               "numel": sum(p.numel() for p in g["params"])} for g in optimizer.param_groups]
    if hasattr(scheduler, "lr_lambdas"):
        schedule = [[base * f(step) for base, f in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
                    for step in range(max_steps)]
    else:
        schedule = None  # a scheduler that is not a LambdaLR: not read
    return {"trainable": {key: list(p.shape) for key, p in params.items()},
            "trainable_numel": sum(p.numel() for p in params.values()), "lora_scaling": scaling,
            "optimizer": {"class": type(getattr(optimizer, "optimizer", optimizer)).__name__, "groups": groups},
            "schedule": schedule}


def check(config: dict, backend_name: str, *, model_path: str, dataset: dict, batch: dict, max_steps: int,
          out: Path, tensors: Path, log=print) -> dict:
    """Runs the trainer check of `backend_name` on the saved `batch`; writes its figures (`out`) and its per-token
    and per-parameter tensors (`tensors`, for the comparison)."""
    import torch

    from ..training import backends
    from ..training.session import session

    began = time.perf_counter()
    built_as = backends.trainer_check_backend(backend_name, config["dtype"])
    if built_as != backend_name:
        log(f"[{backend_name}] its engine cannot load in {config['dtype']}: the check (which never samples) builds "
            f"the same trainer stack without it, {built_as}")
    with session(config, built_as, max_steps, model_path=model_path, dataset=dataset, log=log) as built:
        trainer = built.trainer
        params = set_adapter(trainer.model, config["grpo"]["seed"])
        trainer.create_optimizer_and_scheduler(num_training_steps=max_steps)
        trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
        trainer.model.train()
        rows = _use_batch(trainer, batch)
        prepared = trainer._generate_and_score_completions(rows)
        per_token = _per_token(trainer, batch)
        trainer.optimizer.zero_grad()
        kl_term = float(_loss(trainer, prepared, zero_advantages=True).detach())
        trainer.optimizer.zero_grad()
        for values in trainer._metrics["train"].values():
            values.clear()
        loss = _loss(trainer, prepared)
        logged = {k: float(v[-1]) for k, v in trainer._metrics["train"].items() if v}
        trainer.accelerator.backward(loss)
        grads = {key: (p.grad.detach().float().cpu().clone() if p.grad is not None else torch.zeros(p.shape))
                 for key, p in params.items()}
        max_norm = trainer.args.max_grad_norm
        norm = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads.values()])))
        if max_norm:
            trainer.accelerator.clip_grad_norm_(list(params.values()), max_norm)
        before = {key: p.detach().float().cpu().clone() for key, p in params.items()}
        trainer.optimizer.step()
        update = {key: p.detach().float().cpu() - before[key] for key, p in params.items()}
        setup = _setup(trainer, params, max_steps)
        warnings = built.warned.records()
    beta = config["grpo"].get("beta") or 0.0
    advantages = prepared["advantages"].detach().float().cpu().reshape(len(batch["completion_ids"]), -1)[:, 0]
    lengths = [len(c) for c in batch["completion_ids"]]
    # The loss as the settings define it at ratio 1 (one iteration: old = current), summed over the tokens: a stack's
    # loss divided into it gives the number of tokens (or whatever) the stack normalises by
    per_sequence = -advantages * torch.tensor(lengths, dtype=torch.float32)
    summed = float(per_sequence.sum() + beta * per_token["kl"].sum())
    result = {
        "schema_version": SCHEMA_VERSION, "backend": backend_name, "built_as": built_as,
        "fault": faults.fault_of(backend_name),
        "dtype": config["dtype"], "seed": config["grpo"]["seed"], "max_steps": max_steps, "beta": beta,
        "loss_type": getattr(trainer.args, "loss_type", None), "completions": len(lengths), "tokens": sum(lengths),
        "lengths": lengths,
        "with_advantage": int((advantages != 0).sum()),
        "loss": float(loss.detach()), "kl_term": kl_term, "summed_loss": summed,
        "normaliser": summed / float(loss.detach()) if float(loss.detach()) else None,
        "kl_mean": float(per_token["kl"].mean()), "logged": logged, "grad_norm": norm, "max_grad_norm": max_norm,
        "clip_coefficient": min(1.0, max_norm / (norm + 1e-6)) if max_norm else 1.0, **setup,
        "wall_s": time.perf_counter() - began, "warnings": warnings, "environment": environment.describe()}
    stack_reference = _stack_reference(prepared, sum(lengths))
    result["stack_reference"] = stack_reference is not None
    # the prepared batch's own tensors as the stack laid them out, for reading where a stack's layout differs
    raw = {k: v.detach().cpu() for k, v in prepared.items() if isinstance(v, torch.Tensor)}
    raw.update({k: v for k, v in prepared.items() if isinstance(v, (int, float))})
    torch.save({**per_token, "stack_reference_logps": stack_reference, "advantages": advantages, "gradient": grads,
                "update": update, "prepared": raw}, tensors)
    stats.write_json(out, result)
    log(f"[{backend_name}] loss {result['loss']:.6g}, KL term {kl_term:.3g}, gradient norm {norm:.4g} -> {out}")
    return result
