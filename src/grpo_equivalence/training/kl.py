"""One KL for every stack: the KL the step's loss is about, computed by the workflow the same way whatever the
trainer stack, beside the value the stack logs (which it names `kl` too).

TRL logs the token mean of the batch of k3 = exp(ref - new) - (ref - new) - 1; Unsloth's loss logs the mean of
per-sequence means (docs/findings.md), so two stacks' `kl` are two quantities wherever completion lengths vary.
Before each of the step's loss computations, with the batch the loss is given and the weights it is computed at,
the policy's and the reference model's (the adapter off) log-probability of every completion token are computed
here, at the trainer's temperature, one sequence at a time (so that no batch of full-vocabulary logits is held),
and k3 is summed over the completion tokens: the step's `kl` is that sum over its token count, TRL's definition.
The time it takes is measured (synchronised) and left out of the step's time.
"""

import contextlib
import os
import time

UNSLOTH_LOGITS_ENV = "UNSLOTH_RETURN_LOGITS"  # Unsloth's forward returns no logits in training otherwise
ROWS = 1  # sequences per forward pass of the computation


def sequence_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature: float):
    """Per completion token, the model's log-probability of it at `temperature`, for left-padded prompts and
    right-padded completions (TRL's batch layout), ROWS sequences a pass; float32, the completions' shape."""
    import torch

    out = torch.zeros(completion_ids.shape, dtype=torch.float32, device=completion_ids.device)
    width = prompt_ids.shape[1]
    for start in range(0, len(prompt_ids), ROWS):
        rows = slice(start, start + ROWS)
        ids = torch.cat([prompt_ids[rows], completion_ids[rows]], dim=1)
        mask = torch.cat([prompt_mask[rows], completion_mask[rows]], dim=1)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, width - 1:-1].float() / temperature
        out[rows] = torch.log_softmax(logits, -1).gather(-1, completion_ids[rows].unsqueeze(-1)).squeeze(-1)
    return out


def k3_sum(trainer, inputs: dict) -> tuple[float, int] | None:
    """The step's batch `inputs` (TRL's keys): the sum over its completion tokens of k3 between the policy and the
    reference model (the adapter off), and the token count; None where the batch or the model lacks what it needs
    (no adapter to turn off)."""
    import torch

    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not all(isinstance(inputs.get(k), torch.Tensor) for k in keys) or not hasattr(model, "disable_adapter"):
        return None
    temperature = float(getattr(trainer, "temperature", None) or trainer.args.temperature or 1.0)
    batch = [inputs[k] for k in keys]
    was_training, previous = model.training, os.environ.get(UNSLOTH_LOGITS_ENV)
    model.eval()
    os.environ[UNSLOTH_LOGITS_ENV] = "1"
    try:
        with torch.no_grad(), trainer.compute_loss_context_manager():
            policy = sequence_logps(model, *batch, temperature)
            with model.disable_adapter():
                reference = sequence_logps(model, *batch, temperature)
    finally:
        os.environ.pop(UNSLOTH_LOGITS_ENV) if previous is None else os.environ.update({UNSLOTH_LOGITS_ENV: previous})
        model.train(was_training)
    delta = reference - policy
    mask = inputs["completion_mask"].float()
    return float(((torch.exp(delta) - delta - 1) * mask).sum()), int(mask.sum())


@contextlib.contextmanager
def computed(trainer, recorder, synchronize=lambda: None):
    """Within the block, before each of the trainer's loss computations in training, the KL of its batch is
    computed (k3_sum) and handed to `recorder.add_kl(total, tokens, seconds)`."""
    import torch

    compute_loss = trainer.compute_loss

    def with_kl(model, inputs, *args, **kwargs):
        if model.training and torch.is_grad_enabled():
            synchronize()
            began = time.perf_counter()
            found = k3_sum(trainer, inputs)
            synchronize()
            if found is not None:
                recorder.add_kl(*found, time.perf_counter() - began)
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = with_kl
    try:
        yield
    finally:
        trainer.compute_loss = compute_loss
