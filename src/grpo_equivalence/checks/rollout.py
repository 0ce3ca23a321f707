"""The rollout check: does a backend sample what the study's settings say, at fixed weights, without training?

From one checkpoint (the study's model with a fresh adapter), each backend samples completions for the same
prompts through its own rollout path (the GRPOTrainer a train job builds, its generation method called as
training calls it), and the trainer's own forward pass scores every sampled token under the distribution the
settings define (grpo_equivalence.checks.scoring: outside the support, clearly beyond the rounding, and the score
log q(x) + H(q) at the positions the rounding does not decide). It samples a round (every prompt,
num_generations completions each) at a time, and stops once its tokens reach what the check needs to detect the
named faults and confirm a correct sampler with the power grpo_equivalence.checks.power aims for, or the study's
cap. Per completion, its length and reward; where the backend reports its own log-probability of the token
(vLLM), the sampler/trainer mismatch. grpo_equivalence.checks.rollout_verdict judges one backend's file against
the reference's.
"""

import math
import os
import time
from pathlib import Path

from ..analysis import stats
from ..runtime import environment
from ..study.config import rollout_check_settings
from ..training import backends, faults
from . import power, scoring

# Sampling settings the intended distribution is built from (the trainer's, read back from its arguments).
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")
SCHEMA_VERSION = 2  # 2: decided positions, two-sided margins, each fault's effect, rounds sampled to a plan
SCORE_BATCH = 32  # completions per scoring forward pass, at most
# ... and no more than keep one float32 copy of their logits within this many bytes: scoring holds several copies
# (the warpers', the alternatives'), which at a real vocabulary (Qwen3's 151,936) and 32 completions of 640 tokens
# would be 12 GB each
SCORE_BYTES = 2 ** 30


def score_batch(sequence_length: int, vocabulary: int) -> int:
    """Completions per scoring pass for sequences up to `sequence_length` tokens over `vocabulary` logits."""
    return max(1, min(SCORE_BATCH, SCORE_BYTES // (4 * max(1, sequence_length) * max(1, vocabulary))))


def family_size(config: dict) -> int:
    """The divergence tests a report judges together (rollout_verdict.finalize): support and score of every
    candidate, the other backends and the reference's control."""
    return 2 * max(1, len(config.get("backends") or []))


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


def check(config: dict, backend_name: str, *, model_path: str, dataset: dict, out: Path, seed: int | None = None,
          log=print) -> dict:
    """Samples the rollout check's prompts through `backend_name`'s rollout path, a round at a time, scores each
    round, and stops once the tokens reach the plan (power.plan) or the study's cap; writes the scored file."""
    from ..training.session import session

    seed = config["grpo"]["seed"] if seed is None else seed
    began = time.perf_counter()
    with session(config, backend_name, 1, model_path=model_path, dataset=dataset, seed=seed, log=log) as built:
        return check_on(built, config, backend_name, out=out, seed=seed, log=log, began=began)


def check_on(built, config: dict, backend_name: str, *, out: Path, seed: int, log=print,
             began: float | None = None) -> dict:
    """The rollout check of `backend_name` through a session built already (training.session): the backend's own,
    or, for BACKEND+FAULT with a sampling fault, BACKEND's, the fault put into its sampler for this check alone and
    taken out after (faults.sampling_fault), so that checks of one backend at several seeds and faults share one
    trainer and engine. Every check starts its random streams from its own `seed`."""
    from ..training.session import seed_samplers

    began = time.perf_counter() if began is None else began
    base, fault = faults.split(backend_name)
    if built.backend not in (backend_name, base):
        raise ValueError(f"a session built for {built.backend} cannot check {backend_name}: build it for {base}")
    # its loading's warnings and its own, not those an earlier check of a shared session raised
    earlier = set(built.warned.counts) - built.loading_warnings
    with faults.sampling_fault(built.trainer, fault if built.backend == base else None) as changed:
        seed_samplers(seed)
        return _sample_and_score(built, config, backend_name, out=out, seed=seed, log=log, began=began,
                                 changed=changed, earlier=earlier)


def _sample_and_score(built, config: dict, backend_name: str, *, out: Path, seed: int, log, began: float,
                      changed: list, earlier: set) -> dict:
    check_settings = rollout_check_settings(config.get("rollout_check"))
    alpha, family = config.get("verdict", {}).get("alpha", 0.05), family_size(config)
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
    rounding = check_settings["tolerance"] or scoring.ROUNDING[config["dtype"]]
    scorer = _Scorer(trainer, config, sampling, rounding, check_settings)
    profile = power.empty_profile(faults.SAMPLING)
    completions_out, sample_s, rounds = [], 0.0, 0
    log(f"[{backend_name}] sampling rounds of {generations} completions for each of {count} prompts, {per_call} "
        f"prompts a call: at least {check_settings['rounds']}, at most {check_settings['max_rounds']}, until the "
        f"tokens reach the plan")
    while True:
        sampled = []
        for start in range(0, count, per_call):
            batch = rows[start:start + per_call]
            prompts = [row["prompt"] for row in batch for _ in range(generations)]
            t0 = time.perf_counter()
            output = trainer._generate(prompts)
            sample_s += time.perf_counter() - t0
            prompt_ids, completion_ids, completions, logprobs = output[0], output[1], output[3], output[4]
            inputs = [row for row in batch for _ in range(generations)]
            total = _rewards(trainer, inputs, prompts, completions, [list(ids) for ids in completion_ids])
            sampled += [{"prompt": start + i // generations, "prompt_ids": list(prompt_ids[i]),
                         "completion_ids": list(completion_ids[i]), "reward": total[i],
                         "sampler_logprobs": None if logprobs is None else [float(v) for v in logprobs[i]]}
                        for i in range(len(prompts))]
        log(f"[{backend_name}] round {rounds + 1}: scoring {sum(len(r['completion_ids']) for r in sampled)} tokens")
        for record, sums, effects in scorer.score(sampled):
            completions_out.append({"prompt": record["prompt"], "reward": record["reward"], **sums})
            power.add(profile, sums, effects)
        rounds += 1
        planned = power.plan(profile, alpha=alpha, family=family,
                             paired=power.paired_rates(completions_out, check_settings["margin"]))
        log(f"[{backend_name}] {profile['tokens']} tokens after {rounds} round(s); the plan: " + (
            f"{planned['tokens']} tokens" if planned["tokens"] is not None else
            "none (no size confirms or detects all it should here: more rounds would not change that)"))
        if rounds >= check_settings["max_rounds"] or (rounds >= check_settings["rounds"] and (
                planned["tokens"] is None or profile["tokens"] >= planned["tokens"])):
            break
    warnings = [w for w in built.warned.records() if (w["source"], w["message"]) not in earlier]
    result = {
        "schema_version": SCHEMA_VERSION,
        "backend": backend_name,
        "seed": seed,
        "model": config["model"],
        "dataset": config["dataset"]["path"],
        "fault": faults.split(backend_name)[1],
        "sampling": sampling,
        "dtype": config["dtype"],
        "tolerance": rounding,
        "temperature_margin": check_settings["temperature_margin"],
        "order": check_settings["order"],
        "sampler_order": backends.get(backend_name).sampler_order,  # the filters' order its sampler applies
        "prompts": count,
        "generations": generations * rounds,
        "rounds": rounds,
        "max_rounds": check_settings["max_rounds"],
        "profile": profile,
        "plan": planned,
        "rollout_settings": built.rollout_settings + [c for c in changed if c not in built.rollout_settings],
        "sample_s": sample_s,
        "wall_s": time.perf_counter() - began,
        "completions": completions_out,
        # exp(|sampler logp - trainer logp|) per token, as NeMo-RL's token_mult_prob_error; null: not reported
        "mismatch": scoring.mismatch_figures(scorer.mismatch, scorer.sure) if scorer.mismatch else None,
        "warnings": warnings,
        "environment": environment.describe(),
    }
    stats.write_json(out, result)
    log(f"[{backend_name}] {len(completions_out)} completions, {profile['tokens']} tokens -> {out}")
    return result


def _rewards(trainer, inputs: list[dict], prompts, completions, completion_ids) -> list[float]:
    """Each completion's reward as training computes it: through TRL's own reward path (every column of the data
    set, completion_ids, the trainer's state; a wrong number of rewards refused; None as NaN), weighted by
    reward_weights and summed over the functions that scored it; NaN where none did (TRL's "unscorable")."""
    import torch

    per_function = trainer._calculate_rewards(inputs, prompts, completions, completion_ids)
    total = (per_function * trainer.reward_weights.to(per_function.device).unsqueeze(0)).nansum(dim=1)
    total[torch.isnan(per_function).all(dim=1)] = math.nan
    return [float(value) for value in total]


class _Scorer:
    """The trainer's own model and adapter, evaluated as it computes log-probabilities (its dtype), scoring sampled
    records in batches (scoring.score_tokens)."""

    def __init__(self, trainer, config: dict, sampling: dict, rounding: float, check_settings: dict):
        self.model, self.config, self.sampling, self.rounding = trainer.model, config, sampling, rounding
        self.margin, self.order = check_settings["temperature_margin"], check_settings["order"]
        self.mismatch: list[float] = []
        self.sure: list[bool] = []  # scoring.per_token_agreement's

    def score(self, sampled: list[dict]):
        """(record, completion sums, fault effect sums) per record, in order."""
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
                    joined = scoring.score_tokens(torch.cat(forward_logits(model, batch, device)), torch.tensor(
                        [t for r in batch for t in r["completion_ids"]], device=device), self.sampling,
                        rounding=self.rounding, margin=self.margin, order=self.order) if batch else {}
                    offset = 0
                    for record in sampled[start:start + per_pass]:
                        end = offset + len(record["completion_ids"])
                        scored = _slice(joined, offset, end)
                        offset = end
                        if record["sampler_logprobs"] is not None and record["completion_ids"]:
                            differences, sure = scoring.per_token_agreement(record["sampler_logprobs"], scored)
                            self.mismatch += differences
                            self.sure += sure
                        yield record, scoring.completion_sums(scored), scoring.effect_sums(scored)
        finally:
            model.train(was_training)


def _slice(joined: dict, start: int, end: int) -> dict:
    """One completion's positions of a batch's scored lists (nested per alternative); empty lists for none."""
    if not joined:
        return scoring.empty()
    return {key: _slice(value, start, end) if isinstance(value, dict) else value[start:end]
            for key, value in joined.items()}


COMPLETION_KEYS = ("prompt", "tokens", "reward", "score", "variance", "scored", "decided", "outside", "outside_clear",
                   "hot_shift", "hot_variance", "cold_shift", "cold_variance")


def load(path) -> dict:
    """A rollout-check file, checked: a StatsError naming the file and the field otherwise."""
    run = stats.read_json(path, what="rollout-check file", fix="rerun its rollout_check job")
    if not isinstance(run, dict) or run.get("schema_version") != SCHEMA_VERSION:
        found = run.get("schema_version") if isinstance(run, dict) else None
        raise stats.StatsError(f"{path}: not a rollout-check file of schema {SCHEMA_VERSION}"
                               f"{f' (written by an earlier check, schema {found})' if found else ''}; rerun its "
                               f"rollout_check job")
    for key in ("backend", "seed", "sampling", "completions", "profile"):
        if key not in run:
            raise stats.StatsError(f"{path}: lacks {key}; rerun its rollout_check job")
    for i, completion in enumerate(run["completions"]):
        if completion.get("reward") == "NaN":  # no reward function scored it (TRL's "unscorable"): as written
            completion["reward"] = stats.NON_FINITE["NaN"]
        bad = [k for k in COMPLETION_KEYS
               if not isinstance(completion.get(k), (int, float)) or isinstance(completion.get(k), bool)]
        if bad:
            raise stats.StatsError(f"{path}: completion {i} has no number for {', '.join(bad)}; "
                                   "rerun its rollout_check job")
    return run
