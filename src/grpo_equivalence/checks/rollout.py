"""The rollout check: does a backend sample what the study's settings say, at fixed weights, without training?

From one checkpoint (the study's model with a fresh adapter), each backend samples completions for the same
prompts through its own rollout path (the GRPOTrainer a train job builds, its generation method called as
training calls it), and the trainer's own forward pass scores every sampled token under the distribution the
settings define: the logits at temperature, then top-k, top-p and min-p as transformers applies them. Per
token that gives
- whether the intended distribution excludes it (outside its support), strictly, and clearly: still outside
  when its own logit is raised by `tolerance` (numerical noise between the sampler's and the scorer's
  logits can flip a token at the edge of the support; a sampler that ignores min_p or top_k cannot hide
  behind it);
- its log-probability log q(x) under that distribution, the entropy H of q, and the variance of log q under q:
  under correct sampling, log q(x) + H has mean 0 and that variance at every token, whatever came before, so
  the sum over tokens is a score statistic whose null distribution is known exactly (a sampler too hot
  draws unlikely tokens: the sum drops; too cold: it rises);
- where the backend reports its own log-probability of the token (vLLM), the sampler/trainer mismatch.
Per completion, its length and reward. grpo_equivalence.checks.rollout_verdict judges one backend's file against
the reference's.
"""

import math
import os
import time
from pathlib import Path

from ..analysis import stats
from ..runtime import environment
from ..study.config import rollout_check_settings
from ..training import faults

# Sampling settings the intended distribution is built from (the trainer's, read back from its arguments).
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")
SCHEMA_VERSION = 1
# Raised by this much (a raw logit), a sampled token the settings exclude still counts as outside the support: the
# sampler's and the scorer's logits differ by rounding, far more in 16-bit than in 32-bit arithmetic.
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.1}
SCORE_BATCH = 32  # completions per scoring forward pass, at most
# ... and no more than keep one float32 copy of their logits within this many bytes: scoring holds several copies
# (the warpers', the raised logits'), which at a real vocabulary (Qwen3's 151,936) and 32 completions of 640 tokens
# would be 12 GB each
SCORE_BYTES = 2 ** 30


def score_batch(sequence_length: int, vocabulary: int) -> int:
    """Completions per scoring pass for sequences up to `sequence_length` tokens over `vocabulary` logits."""
    return max(1, min(SCORE_BATCH, SCORE_BYTES // (4 * max(1, sequence_length) * max(1, vocabulary))))


# The order the filters apply in, which changes the distribution where top_p binds: transformers' generate()
# takes top-k, top-p, then min-p; vLLM takes min-p first (a logits processor), then top-k and top-p.
ORDERS = {"transformers": ("top_k", "top_p", "min_p"), "vllm": ("min_p", "top_k", "top_p")}


def processors(settings: dict, order: str = "transformers"):
    """transformers' own logits warpers for the settings: temperature, then the filters in `order` (ORDERS)."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    chain = LogitsProcessorList()
    if settings.get("temperature") not in (None, 1.0):
        chain.append(TemperatureLogitsWarper(settings["temperature"]))
    make = {"top_k": lambda v: TopKLogitsWarper(v), "top_p": lambda v: TopPLogitsWarper(v),
            "min_p": lambda v: MinPLogitsWarper(v)}
    skip = {"top_k": (None, 0), "top_p": (None, 1.0), "min_p": (None, 0, 0.0)}
    for key in ORDERS[order]:
        if settings.get(key) not in skip[key]:
            chain.append(make[key](settings[key]))
    return chain


def score_tokens(logits, tokens, settings: dict, tolerance: float, hotter: float, order: str = "transformers") -> dict:
    """Per position of one completion: `logits` (T, V) as the model gives them for predicting `tokens` (T,).
    Returns per-token lists: log q(x), entropy H of q, variance of log q under q, outside (strict), outside
    (clear), and the mean of log q(x) + H that a sampler `hotter` times the temperature would give (within q's
    support): the yardstick of the score test's margin."""
    import torch

    logits = logits.float()
    dummy = torch.zeros((logits.shape[0], 1), dtype=torch.long, device=logits.device)
    chain = processors(settings, order)
    logq = torch.log_softmax(chain(dummy, logits.clone()), dim=-1)
    picked = logq.gather(1, tokens[:, None]).squeeze(1)
    q = logq.exp()
    inside = torch.isfinite(logq)
    finite = torch.where(inside, logq, torch.zeros_like(logq))
    entropy = -(q * finite).sum(-1)
    variance = ((q * finite ** 2).sum(-1) - entropy ** 2).clamp_min(0.0)
    raised = logits.clone()
    raised.scatter_add_(1, tokens[:, None], torch.full((len(tokens), 1), float(tolerance), device=logits.device))
    clear = ~torch.isfinite(chain(dummy, raised).gather(1, tokens[:, None]).squeeze(1))
    hot = torch.softmax(processors({**settings, "temperature": (settings.get("temperature") or 1.0) * hotter}, order)(
        dummy, logits.clone()), dim=-1) * inside
    hot_shift = (hot * (finite + entropy[:, None])).sum(-1) / hot.sum(-1).clamp_min(1e-30)
    return {"logq": picked.tolist(), "entropy": entropy.tolist(), "variance": variance.tolist(),
            "outside": (~torch.isfinite(picked)).tolist(), "outside_clear": clear.tolist(),
            "hot_shift": hot_shift.tolist()}


def _forward_logits(model, records: list[dict], device) -> list:
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


def check(config: dict, backend_name: str, *, model_path: str, dataset: dict, out: Path, seed: int | None = None,
          log=print) -> dict:
    """Samples the rollout check's prompts through `backend_name`'s rollout path and writes the scored file."""
    import torch

    from ..training.session import session

    check_settings = rollout_check_settings(config.get("rollout_check"))
    rounds = check_settings["rounds"]  # each prompt sampled rounds x num_generations times
    seed = config["grpo"]["seed"] if seed is None else seed
    began = time.perf_counter()
    with session(config, backend_name, 1, model_path=model_path, dataset=dataset, seed=seed, log=log) as built:
        trainer = built.trainer
        sampling = {key: getattr(trainer.args, key) for key in SAMPLING_KEYS}  # the trainer's, not the sampler's
        generations = trainer.num_generations
        # prompts per generation call: the training batch's, unless the study asks for larger calls (faster on a CPU)
        per_call = check_settings["prompts_per_call"] or max(1, trainer.args.generation_batch_size // generations)
        problems = trainer.train_dataset
        count = min(check_settings["prompts"], len(problems))
        if count < check_settings["prompts"]:
            log(f"[{backend_name}] the data set has {count} problems: the check samples all of them")
        rows = [problems[i] for i in range(count)]  # the same prompts, in the same order, for every backend
        rewards = trainer.reward_funcs
        sampled, sample_s = [], 0.0
        log(f"[{backend_name}] sampling {generations} x {rounds} completions for each of {count} prompts, {per_call} "
            f"prompts a call")
        for start in [s for _ in range(rounds) for s in range(0, count, per_call)]:
            batch = rows[start:start + per_call]
            prompts = [row["prompt"] for row in batch for _ in range(generations)]
            t0 = time.perf_counter()
            output = trainer._generate(prompts)
            sample_s += time.perf_counter() - t0
            prompt_ids, completion_ids, completions, logprobs = output[0], output[1], output[3], output[4]
            answers = [row["answer"] for row in batch for _ in range(generations)]
            total = [0.0] * len(prompts)
            for function in rewards:
                for i, value in enumerate(function(completions=completions, answer=answers, prompts=prompts)):
                    total[i] += value if value is not None else math.nan
            for i in range(len(prompts)):
                sampled.append({"prompt": start + i // generations, "prompt_ids": list(prompt_ids[i]),
                                "completion_ids": list(completion_ids[i]), "reward": total[i],
                                "sampler_logprobs": None if logprobs is None else [float(v) for v in logprobs[i]]})
        # Scoring: the trainer's own model and adapter, evaluated as it computes log-probabilities (its dtype)
        log(f"[{backend_name}] scoring {sum(len(s['completion_ids']) for s in sampled)} tokens")
        model = trainer.model
        was_training = model.training
        model.eval()
        os.environ["UNSLOTH_RETURN_LOGITS"] = "1"  # Unsloth's forward returns no logits in training otherwise
        device = next(model.parameters()).device
        completions_out, mismatch = [], []
        autocast = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if (
            device.type == "cuda" and config["dtype"] == "bfloat16") else torch.autocast("cpu", enabled=False)
        tolerance = check_settings["tolerance"] or TOLERANCE[config["dtype"]]
        hotter = 1 + check_settings["temperature_margin"]
        per_pass = score_batch(max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in sampled),
                               model.config.vocab_size)
        with torch.no_grad(), autocast:
            for start in range(0, len(sampled), per_pass):
                batch = sampled[start:start + per_pass]
                scored_batch = [r for r in batch if r["completion_ids"]]
                # every position of the batch scored at once, then split back per completion
                joined = score_tokens(torch.cat(_forward_logits(model, scored_batch, device)), torch.tensor(
                    [t for r in scored_batch for t in r["completion_ids"]], device=device), sampling, tolerance,
                    hotter, check_settings["order"]) if scored_batch else {}
                offset = 0
                for record in batch:
                    if not record["completion_ids"]:
                        completions_out.append(_completion(record, None))
                        continue
                    end = offset + len(record["completion_ids"])
                    scored = {key: values[offset:end] for key, values in joined.items()}
                    offset = end
                    completions_out.append(_completion(record, scored))
                    if record["sampler_logprobs"] is not None:
                        mismatch += [s - q for s, q in zip(record["sampler_logprobs"], scored["logq"], strict=True)
                                     if math.isfinite(q)]
        model.train(was_training)
        warnings = built.warned.records()
        fault = faults.split(backend_name)[1]
        rollout_settings = built.rollout_settings
    result = {
        "schema_version": SCHEMA_VERSION,
        "backend": backend_name,
        "seed": seed,
        "model": config["model"],
        "dataset": config["dataset"]["path"],
        "fault": fault,
        "sampling": sampling,
        "tolerance": tolerance,
        "temperature_margin": check_settings["temperature_margin"],
        "order": check_settings["order"],
        "prompts": count,
        "generations": generations * rounds,
        "rollout_settings": rollout_settings,
        "sample_s": sample_s,
        "wall_s": time.perf_counter() - began,
        "completions": completions_out,
        # exp(|sampler logp - trainer logp|) per token, as NeMo-RL's token_mult_prob_error; null: not reported
        "mismatch": _mismatch(mismatch) if mismatch else None,
        "warnings": warnings,
        "environment": environment.describe(),
    }
    stats.write_json(out, result)
    log(f"[{backend_name}] {len(completions_out)} completions, {sum(c['tokens'] for c in completions_out)} tokens "
        f"-> {out}")
    return result


def _completion(record: dict, scored: dict | None) -> dict:
    """One completion in a few sums (the per-token values are not kept: the file stays small)."""
    tokens = len(record["completion_ids"])
    if scored is None:
        return {"prompt": record["prompt"], "tokens": 0, "reward": record["reward"], "score": 0.0, "variance": 0.0,
                "hot_shift": 0.0, "scored": 0, "outside": 0, "outside_clear": 0}
    inside = [i for i, out in enumerate(scored["outside"]) if not out]
    return {"prompt": record["prompt"], "tokens": tokens, "reward": record["reward"],
            # the centred score sum(log q(x) + H) and its null variance, over the tokens inside the support
            "score": sum(scored["logq"][i] + scored["entropy"][i] for i in inside),
            "variance": sum(scored["variance"][i] for i in inside),
            # what a sampler hotter by the margin would shift the score sum by (negative)
            "hot_shift": sum(scored["hot_shift"][i] for i in inside),
            "scored": len(inside),
            "outside": sum(scored["outside"]), "outside_clear": sum(scored["outside_clear"])}


def _mismatch(differences: list[float]) -> dict:
    absolute = [abs(d) for d in differences]
    return {"tokens": len(differences), "token_mult_prob_error": sum(math.exp(a) for a in absolute) / len(absolute),
            "mean_abs_logp_diff": sum(absolute) / len(absolute), "max_abs_logp_diff": max(absolute)}


COMPLETION_KEYS = ("prompt", "tokens", "reward", "score", "variance", "hot_shift", "scored", "outside", "outside_clear")


def load(path) -> dict:
    """A rollout-check file, checked: a StatsError naming the file and the field otherwise."""
    run = stats.read_json(path, what="rollout-check file", fix="rerun its rollout_check job")
    if not isinstance(run, dict) or run.get("schema_version") != SCHEMA_VERSION:
        raise stats.StatsError(f"{path}: not a rollout-check file of schema {SCHEMA_VERSION}; rerun its rollout_check job")
    for key in ("backend", "seed", "sampling", "completions"):
        if key not in run:
            raise stats.StatsError(f"{path}: lacks {key}; rerun its rollout_check job")
    for i, completion in enumerate(run["completions"]):
        bad = [k for k in COMPLETION_KEYS if not isinstance(completion.get(k), (int, float)) or isinstance(completion.get(k), bool)]
        if bad:
            raise stats.StatsError(f"{path}: completion {i} has no number for {', '.join(bad)}; rerun its rollout_check job")
    return run
