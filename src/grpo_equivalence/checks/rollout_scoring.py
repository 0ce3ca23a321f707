"""The rollout check's scoring passes: the trainer's own forward pass over sampled completions, in batches that keep
a real vocabulary's logits small, each completion scored with the trainer's logits (scoring) and, where the
backend reported them, with its sampler's own (exact)."""

import math
import os

from . import exact, scoring

SCORE_BATCH = 32  # completions per scoring forward pass, at most
# ... and no more than keep one float32 copy of their logits within this many bytes: scoring holds several copies
# (the warpers', the alternatives'), which at a real vocabulary (Qwen3's 151,936) and 32 completions of 640 tokens
# would be 12 GB each
SCORE_BYTES = 2 ** 30


def score_batch(sequence_length: int, vocabulary: int) -> int:
    """Completions per scoring pass for sequences up to `sequence_length` tokens over `vocabulary` logits."""
    return max(1, min(SCORE_BATCH, SCORE_BYTES // (4 * max(1, sequence_length) * max(1, vocabulary))))


def forward_logits(model, records: list[dict], device) -> list:
    """The model's logits at each completion's positions (predicting each completion token), for a batch of
    records padded on the right (a causal model's earlier positions never see the padding)."""
    import torch

    sequences = [r["prompt_ids"] + r["completion_ids"] for r in records]
    width = max(map(len, sequences))
    ids = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(sequences):
        ids[i, :len(seq)] = torch.tensor(seq, device=device)
        mask[i, :len(seq)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits
    return [logits[i, len(r["prompt_ids"]) - 1: len(r["prompt_ids"]) + len(r["completion_ids"]) - 1]
            for i, r in enumerate(records)]


class Scorer:
    """The trainer's own model and adapter, evaluated as it computes log-probabilities (its dtype), scoring sampled
    records in batches (scoring.score_tokens)."""

    def __init__(self, trainer, config: dict, sampling: dict, rounding: float, check_settings: dict, own_order: str):
        self.model, self.config, self.sampling, self.rounding = trainer.model, config, sampling, rounding
        self.margin, self.order = check_settings["temperature_margin"], check_settings["order"]
        self.own_order = own_order
        self.mismatch: list[float] = []
        self.sure: list[bool] = []  # per_token_agreement's

    def score(self, sampled: list[dict]):
        """(record, completion sums, fault effect sums, own effect sums or None) per record, in order."""
        import torch

        model = self.model
        was_training = model.training
        model.eval()
        os.environ["UNSLOTH_RETURN_LOGITS"] = "1"  # Unsloth's forward returns no logits in training otherwise
        device = next(model.parameters()).device
        autocast = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if (
            device.type == "cuda" and self.config["dtype"] == "bfloat16") else torch.autocast("cpu", enabled=False)
        per_pass = score_batch(max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in sampled),
                               model.config.vocab_size)
        try:
            with torch.no_grad(), autocast:
                for start in range(0, len(sampled), per_pass):
                    batch = [r for r in sampled[start:start + per_pass] if r["completion_ids"]]
                    logits = torch.cat(forward_logits(model, batch, device)) if batch else None
                    tokens = torch.tensor([t for r in batch for t in r["completion_ids"]], device=device)
                    joined = scoring.score_tokens(logits, tokens, self.sampling, rounding=self.rounding,
                                                  margin=self.margin, order=self.order) if batch else {}
                    own = self._own(batch, logits, tokens) if batch and batch[0]["view"] is not None else None
                    offset = 0
                    for record in sampled[start:start + per_pass]:
                        end = offset + len(record["completion_ids"])
                        scored = _slice(joined, offset, end)
                        if record["sampler_logprobs"] is not None and record["completion_ids"]:
                            differences, sure = per_token_agreement(record["sampler_logprobs"], scored)
                            self.mismatch += differences
                            self.sure += sure
                        sums, own_effects = scoring.completion_sums(scored), None
                        if record["view"] is not None:
                            mine = _slice(own["scored"], offset, end) if own else scoring.empty()
                            sums.update({f"own_{k}": v for k, v in scoring.completion_sums(mine).items()
                                         if k != "tokens"}, own_unjudged=sum(mine.get("unjudged", [])))
                            sums.update(exact.numerics_sums(own["sampler"][offset:end] if own else [],
                                                            own["trainer"][offset:end] if own else []))
                            own_effects = scoring.effect_sums(mine)
                        offset = end
                        yield record, sums, scoring.effect_sums(scored), own_effects
        finally:
            model.train(was_training)

    def _own(self, batch: list[dict], logits, tokens) -> dict:
        """The batch's positions scored on the sampler's own logits (exact.score_own), and each token's raw
        log-probability by the sampler and by the trainer (the numerics)."""
        import torch

        views = [r["view"] for r in batch]
        trainer = torch.log_softmax(logits.float(), -1).gather(1, tokens[:, None]).squeeze(1)
        return {"scored": exact.score_own(views, self.sampling, margin=self.margin, order=self.own_order,
                                          vocabulary=logits.shape[-1]),
                "sampler": exact.raw_logprobs(views).tolist(), "trainer": trainer.tolist()}


def _slice(joined: dict, start: int, end: int) -> dict:
    """One completion's positions of a batch's scored lists (nested per alternative); empty lists for none."""
    if not joined:
        return scoring.empty()
    return {key: _slice(value, start, end) if isinstance(value, dict) else value[start:end]
            for key, value in joined.items()}


# A sampler "sure" of a token: its own probability of it at least SAMPLER_SURE, where the settings give it at most
# SETTINGS_UNSURE and the rounding cannot change what they keep (a decided position). A sampler with the settings'
# support and the scorer's logits up to rounding cannot be: the token's rivals keep a share the rounding does not take
# away (a 10 % temperature error moves 0.99 to 0.994, not 0.9999). One that drops every rival the settings keep is.
SAMPLER_SURE, SETTINGS_UNSURE = 1 - 1e-4, 0.99


def per_token_agreement(sampler_logprobs: list[float], scored: dict) -> tuple[list[float], list[bool]]:
    """A completion's sampler log-probabilities (the backend's own, of each token it drew, after its temperature and
    filters) beside the settings' (scoring.score_tokens' lists): the differences, sampler minus settings, at the
    tokens the settings keep; and at each decided position where the settings give the drawn token at most
    SETTINGS_UNSURE, whether the sampler gave it at least SAMPLER_SURE."""
    differences, sure = [], []
    for own, settings, decided in zip(sampler_logprobs, scored["logq"], scored["decided"], strict=True):
        if not math.isfinite(settings):
            continue
        differences.append(own - settings)
        if decided and settings <= math.log(SETTINGS_UNSURE):
            sure.append(own >= math.log(SAMPLER_SURE))
    return differences, sure


def mismatch_figures(differences: list[float], sure: list[bool]) -> dict:
    """The sampler/trainer mismatch of a check, from per_token_agreement's lists: NeMo-RL's token_mult_prob_error
    and the absolute differences; the signed mean with its standard error (its draws are the sampler's, so with the
    scorer's logits the mean estimates the KL divergence of the sampler's distribution from the settings' on the
    tokens they keep: above 0 when it keeps fewer tokens or runs colder; in 16 bits the rounding moves it too, by
    either sign, so read it against the reference's); and the sampler's sureness where the settings leave a choice
    (`unsure_positions`, of them `sampler_sure`), which the rounding does not make."""
    absolute = [abs(d) for d in differences]
    mean = sum(differences) / len(differences)
    spread = math.sqrt(sum((d - mean) ** 2 for d in differences) / (len(differences) - 1)) if len(differences) > 1 \
        else None
    return {"tokens": len(differences), "token_mult_prob_error": sum(math.exp(a) for a in absolute) / len(absolute),
            "mean_abs_logp_diff": sum(absolute) / len(absolute), "max_abs_logp_diff": max(absolute),
            "mean_logp_diff": mean, "se_logp_diff": None if spread is None else spread / math.sqrt(len(differences)),
            "unsure_positions": len(sure), "sampler_sure": sum(sure)}
