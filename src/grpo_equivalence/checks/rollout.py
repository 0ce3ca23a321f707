"""The rollout check: does a backend sample what the study's settings say, at fixed weights, without training?

From one checkpoint (the study's model with a fresh adapter), each backend samples completions for the same
prompts through its own rollout path (the GRPOTrainer a train job builds, its generation method called as
training calls it). Where the backend reports the logits its sampler drew each token from
(training.sampler_logits), the settings are applied to those very logits (grpo_equivalence.checks.exact: the
sampler on its own, exactly, at any temperature and precision), and its raw log-probability of each token is set
against the trainer's at the same weights (the numerics). For every backend the trainer's own forward pass also
scores every token under the distribution the settings define (grpo_equivalence.checks.scoring: outside the
support, clearly beyond the rounding, and the score log q(x) + H(q) at the positions the rounding does not
decide): the check of a backend that cannot report its logits, judged against the reference's. It samples a round
(every prompt, num_generations completions each) at a time, and stops once its tokens reach what the check needs to
detect the named faults and confirm a correct sampler with the power grpo_equivalence.checks.power aims for, or the
study's cap. Per completion, its length and reward. grpo_equivalence.checks.rollout_verdict judges the files.
"""

import math
import time
from pathlib import Path

from ..analysis import stats
from ..runtime import environment
from ..study.config import rollout_check_settings
from ..training import backends, faults, sampler_logits
from . import exact, power, rollout_scoring, scoring

# Sampling settings the intended distribution is built from (the trainer's, read back from its arguments).
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")
SCHEMA_VERSION = 3  # 3: the sampler's own logits (own_*), the numerics; 2: decided positions, two-sided margins
# A schema-2 file holds what a schema-3 file of a backend that reports no logits holds (the trainer's scores, the
# same fields): it is read as one, so a check run before today's is judged by today's tests
READS = (2, SCHEMA_VERSION)
def family_size(config: dict) -> int:
    """The divergence tests a report judges together (rollout_verdict.finalize), at most: support, score and
    numerics of every backend, the reference's control and the reference's own sampler."""
    return 3 * (max(1, len(config.get("backends") or [])) + 1)


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
    # a configuration's settings are the session's own, so only a session built with them can check it
    shared = backend_name if faults.configuration_of(backend_name) else base
    if built.backend not in (backend_name, shared):
        raise ValueError(f"a session built for {built.backend} cannot check {backend_name}: build it for {shared}")
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
    mechanism = backends.get(backend_name).sampler_logits
    order = check_settings["order"] if mechanism is None else backends.get(backend_name).sampler_order
    scorer = rollout_scoring.Scorer(trainer, config, sampling, rounding, check_settings, own_order=order)
    profile, own_profile = power.empty_profile(faults.SAMPLING), power.empty_profile(faults.SAMPLING)
    completions_out, sample_s, rounds = [], 0.0, 0
    log(f"[{backend_name}] sampling rounds of {generations} completions for each of {count} prompts, {per_call} "
        f"prompts a call: at least {check_settings['rounds']}, at most {check_settings['max_rounds']}, until the "
        f"tokens reach the plan")
    with sampler_logits.recording(trainer, mechanism, sampling) as recorder:
        while True:
            sampled = _sample_round(trainer, rows, per_call, generations, recorder)
            sample_s += sum(r.pop("seconds") for r in sampled)
            log(f"[{backend_name}] round {rounds + 1}: scoring {sum(len(r['completion_ids']) for r in sampled)} "
                f"tokens")
            for record, sums, effects, own_effects in scorer.score(sampled):
                completions_out.append({"prompt": record["prompt"], "reward": record["reward"], **sums})
                power.add(profile, sums, effects)
                if own_effects is not None:
                    power.add(own_profile, {"tokens": sums["tokens"], **{k[4:]: sums[k] for k in sums
                                                                           if k.startswith("own_")}}, own_effects)
            rounds += 1
            planned = power.plan(own_profile if recorder else profile, alpha=alpha, family=family,
                                 paired=power.paired_rates(completions_out, check_settings["margin"]),
                                 one_sample=recorder is not None)
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
        "fault": faults.fault_of(backend_name),
        "sampling": sampling,
        "dtype": config["dtype"],
        "tolerance": rounding,
        "temperature_margin": check_settings["temperature_margin"],
        "order": check_settings["order"],
        "sampler_order": backends.get(backend_name).sampler_order,  # the filters' order its sampler applies
        # how the backend reported the logits its sampler drew from (None: it cannot; own_* are then absent)
        "sampler_logits": mechanism,
        "own_order": order if mechanism else None,  # the order the own view was scored in: the sampler's
        "prompts": count,
        "generations": generations * rounds,
        "rounds": rounds,
        "max_rounds": check_settings["max_rounds"],
        "profile": profile,
        "own_profile": own_profile if mechanism else None,
        "plan": planned,
        "rollout_settings": built.rollout_settings + [c for c in changed if c not in built.rollout_settings],
        "sample_s": sample_s,
        "wall_s": time.perf_counter() - began,
        "completions": completions_out,
        # the sampler's raw log-probabilities against the trainer's (exact.numerics_figures); null: not reported
        "numerics": exact.numerics_figures(completions_out),
        # a backend's processed log-probabilities (vLLM's, without raw logits) against the settings' (scoring)
        "mismatch": rollout_scoring.mismatch_figures(scorer.mismatch, scorer.sure) if scorer.mismatch else None,
        "warnings": warnings,
        "environment": environment.describe(),
    }
    stats.write_json(out, result)
    log(f"[{backend_name}] {len(completions_out)} completions, {profile['tokens']} tokens -> {out}")
    return result


def _sample_round(trainer, rows: list, per_call: int, generations: int, recorder) -> list[dict]:
    """Every prompt of `rows` sampled num_generations times through the trainer's own generation, per_call prompts
    a call: per completion its prompt, tokens, reward, the sampler's log-probabilities where the trainer returns
    them, the logits its sampler drew from where the backend reports them (`view`), and the call's seconds (once)."""
    sampled = []
    for start in range(0, len(rows), per_call):
        batch = rows[start:start + per_call]
        prompts = [row["prompt"] for row in batch for _ in range(generations)]
        t0 = time.perf_counter()
        output = trainer._generate(prompts)
        seconds = time.perf_counter() - t0
        prompt_ids, completion_ids, completions, logprobs = output[0], output[1], output[3], output[4]
        views = recorder.take([list(ids) for ids in completion_ids]) if recorder is not None else None
        inputs = [row for row in batch for _ in range(generations)]
        total = _rewards(trainer, inputs, prompts, completions, [list(ids) for ids in completion_ids])
        sampled += [{"prompt": start + i // generations, "prompt_ids": list(prompt_ids[i]),
                     "completion_ids": list(completion_ids[i]), "reward": total[i], "seconds": seconds if i == 0 else 0,
                     # processed log-probabilities (vLLM's) are the settings' check where no raw logits are
                     "sampler_logprobs": None if logprobs is None or views is not None else [float(v) for v in
                                                                                           logprobs[i]],
                     "view": None if views is None else views[i]} for i in range(len(prompts))]
    return sampled


def _rewards(trainer, inputs: list[dict], prompts, completions, completion_ids) -> list[float]:
    """Each completion's reward as training computes it: through TRL's own reward path (every column of the data
    set, completion_ids, the trainer's state; a wrong number of rewards refused; None as NaN), weighted by
    reward_weights and summed over the functions that scored it; NaN where none did (TRL's "unscorable")."""
    import torch

    per_function = trainer._calculate_rewards(inputs, prompts, completions, completion_ids)
    total = (per_function * trainer.reward_weights.to(per_function.device).unsqueeze(0)).nansum(dim=1)
    total[torch.isnan(per_function).all(dim=1)] = math.nan
    return [float(value) for value in total]


COMPLETION_KEYS = ("prompt", "tokens", "reward", "score", "variance", "scored", "decided", "outside", "outside_clear",
                   "hot_shift", "hot_variance", "cold_shift", "cold_variance")
# ... and where the backend reported its sampler's logits
OWN_KEYS = ("own_score", "own_variance", "own_scored", "own_decided", "own_outside", "own_outside_clear",
            "own_unjudged", "own_hot_shift", "own_hot_variance", "own_cold_shift", "own_cold_variance",
            *exact.NUMERICS_KEYS)


def load(path) -> dict:
    """A rollout-check file, checked: a StatsError naming the file and the field otherwise."""
    run = stats.read_json(path, what="rollout-check file", fix="rerun its rollout_check job")
    if not isinstance(run, dict) or run.get("schema_version") not in READS or (
            run.get("schema_version") != SCHEMA_VERSION and run.get("sampler_logits")):
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
        keys = COMPLETION_KEYS + (OWN_KEYS if run.get("sampler_logits") else ())
        bad = [k for k in keys
               if not isinstance(completion.get(k), (int, float)) or isinstance(completion.get(k), bool)]
        if bad:
            raise stats.StatsError(f"{path}: completion {i} has no number for {', '.join(bad)}; "
                                   "rerun its rollout_check job")
    return run
