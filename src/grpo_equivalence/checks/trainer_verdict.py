"""The trainer check's verdict: each quantity of a backend's trainer check against the reference's, judged against
what changing the reference's own precision does to it, and the first quantity, in the order training computes
them, where the two stacks part.

The floor of a quantity is its relative difference between the reference's check in the study's precision and the
reference's check in the other one (float32 and bfloat16: the control): numerical noise of that size is what the
precision alone does. A quantity differs when its relative difference exceeds FACTOR times that floor (and
MIN_DIFFERENCE, below which float32 itself rounds). The loss and its policy term are relative to the size of what
they sum (the advantages' mean magnitude and the KL term), where rounding acts: a sum that cancels to zero would
otherwise be its own rounding over itself; a term within rounding of zero beside one that differs, by the same
factor, is the loss's normalisation. The control itself sits at the floor by construction: what it
shows is that the method does not call a precision change a difference. The rule, FACTOR and MIN_DIFFERENCE were
fixed before any stack was compared; the scale of the loss and its policy term was changed after reading real checks
(seeds 5001 to 5010) and measured on fresh ones (docs/trainer-check.md). The trainable parameters, their LoRA scaling, the optimizer's groups and the
learning-rate schedule have no precision noise: they are compared exactly (to MIN_DIFFERENCE).

A scalar's own floor is one draw: where the precision's errors happen to cancel in its sum it draws near zero, and a
correct stack whose kernels err otherwise is flagged (on an H100, Liger's kernels at 3 of 10 seeds, seeds 5011 to
5020). So the floor of the KL term, and through it the loss's, is also the control's per-token KL differences summed
with none cancelling (sum of w |d| over the sum of w kl, w each token's weight in the loss: hundreds of numbers,
whose size is stable where their sum is not), and the larger of the two is its floor; the clip coefficient's is the
gradient's where either stack clips (its relative change is at most the gradient's). Changed after reading the
H100's seeds 5011 to 5020 and measured on fresh seeds (docs/trainer-check.md; the bound ||w|| ||d|| was tried first).

FACTOR was 2 until the H100's seeds 5031 to 5050: Liger's kernels, which err apart from the reference's and more than
its own precision change does, were flagged at a vector stage (per-token KL, gradient) at 2 seeds of 20 each, their
difference over the floor at most 3.3 (95th percentile 2.0 over 30 seeds), where the faults lie at 7 or more. A stack
whose kernels err independently of the reference's, k times as much as the precision change, lands about
sqrt(1 + k^2) times the floor: 3 accepts k up to 2.8 and kept the faults then at more than twice the threshold. Set
after reading those seeds, and measured on fresh ones (5051 to 5070: no correct stack flagged, the faults at 1.95
times the threshold or more; docs/trainer-check.md).
"""

import math

# In the order training computes them: the first that differs is where the stacks part
ORDER = ("policy_logps", "reference_logps", "stack_reference_logps", "kl", "advantages", "loss", "gradient",
         "clipping", "update", "trainable", "lora_scaling", "optimizer", "schedule")
# The loss's two terms, judged with it: where only one differs, that term is where the stacks part; where both do
# by one factor, the loss's normalisation
TERMS = ("policy_term", "kl_term")
NAMES = {"policy_logps": "policy log-probabilities", "reference_logps": "reference log-probabilities",
         "stack_reference_logps": "reference log-probabilities the loss reads", "kl": "per-token KL",
         "advantages": "advantages", "loss": "loss", "policy_term": "policy term of the loss",
         "kl_term": "KL term of the loss",
         "gradient": "gradient", "clipping": "gradient clipping", "update": "optimizer update",
         "trainable": "trainable parameters", "lora_scaling": "LoRA scaling", "optimizer": "optimizer groups",
         "schedule": "learning-rate schedule"}
PER_TOKEN = ("policy_logps", "reference_logps", "stack_reference_logps", "kl", "advantages")
EXACT = ("trainable", "lora_scaling", "optimizer", "schedule")
FACTOR = 3.0
MIN_DIFFERENCE = 1e-6
CANCELLING = ("loss", "policy_term")  # sums whose terms may cancel
# Two ratios this close are one factor (a normalisation scales both terms exactly)
SAME_FACTOR = 1e-3


def _flat(values):
    """A quantity as one float64 vector (a dict by its sorted keys): an adapter's gradient has millions of numbers."""
    import torch

    if isinstance(values, dict):
        parts = [_flat(values[key]) for key in sorted(values)]
    elif hasattr(values, "flatten"):
        return values.detach().flatten().to(torch.float64).cpu()
    elif isinstance(values, (list, tuple)):
        parts = [_flat(item) for item in values]
    else:
        return torch.tensor([] if values is None else [float(values)], dtype=torch.float64)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def _norm(values) -> float:
    import torch

    return float(torch.linalg.vector_norm(values))


def relative(a, b) -> float:
    """||a - b|| / ||b|| (0 where both are zero; inf where only b is)."""
    a, b = _flat(a), _flat(b)
    if a.numel() != b.numel():
        return math.inf
    diff, scale = _norm(a - b), _norm(b)
    return diff / scale if scale else (0.0 if diff == 0 else math.inf)


def cosine(a, b) -> float | None:
    a, b = _flat(a), _flat(b)
    na, nb = _norm(a), _norm(b)
    return float(a @ b) / (na * nb) if na and nb and a.numel() == b.numel() else None


def _common(a: dict, b: dict) -> tuple[dict, dict]:
    keys = sorted(set(a) & set(b))
    return {k: a[k] for k in keys}, {k: b[k] for k in keys}


def _modules(candidate: dict, reference: dict) -> dict:
    """Per module (a LoRA layer's A and B together): the candidate's norm over the reference's, and their cosine."""
    grouped = {}
    for key in sorted(set(candidate) & set(reference)):
        grouped.setdefault(key.rsplit(".", 1)[0], []).append(key)
    out = {}
    for module, keys in grouped.items():
        c, r = [candidate[k] for k in keys], [reference[k] for k in keys]
        scale = _norm(_flat(r))
        out[module] = {"ratio": _norm(_flat(c)) / scale if scale else None, "cosine": cosine(c, r)}
    return out


def _values(check: dict, tensors: dict) -> dict:
    """Each quantity of one trainer check, as compare reads it."""
    return {**{q: tensors.get(q) for q in PER_TOKEN}, "kl_term": check["kl_term"], "loss": check["loss"],
            "policy_term": check["loss"] - check["kl_term"],
            "gradient": tensors["gradient"], "clipping": check["clip_coefficient"], "update": tensors["update"],
            "trainable": check["trainable"], "lora_scaling": check["lora_scaling"],
            "optimizer": [[g["lr"], g["weight_decay"], g["eps"], g["betas"], g["numel"]] for g in
                          check["optimizer"]["groups"]], "schedule": check["schedule"]}


def _difference(name: str, candidate, reference) -> float | None:
    """The relative difference of a quantity; None where one stack does not keep it (not compared)."""
    if candidate is None or reference is None:
        return None
    if name == "trainable":
        return 0.0 if candidate == reference else math.inf
    if name in ("gradient", "update"):
        candidate, reference = _common(candidate, reference)
    if name == "optimizer":  # each group's settings one by one: a learning rate is not to be lost beside a count
        if len(candidate) != len(reference):
            return math.inf
        return max((_difference("", c, r) for cg, rg in zip(candidate, reference, strict=True)
                    for c, r in zip(cg, rg, strict=True)), default=0.0)
    try:
        return relative(candidate, reference)
    except (TypeError, ValueError):
        return 0.0 if candidate == reference else math.inf


def _kl_weights(lengths: list[int], loss_type: str | None):
    """Each completion token's weight in the loss's KL term, up to a constant: grpo averages each completion's
    tokens, then the completions; dapo, bnpo and dr_grpo divide the tokens' sum by one number."""
    import torch

    return torch.cat([torch.full((n,), 1.0 / n if loss_type == "grpo" else 1.0, dtype=torch.float64)
                      for n in lengths if n])


def _kl_reach(kl, control_kl, check: dict) -> float:
    """The control's per-token KL differences (d) summed as the KL term sums them, none cancelling, relative to it:
    w . |d| / |w . kl|. 0 where a stack keeps no per-token KL or the KL term is zero."""
    if kl is None or control_kl is None or kl.numel() != control_kl.numel():
        return 0.0
    weights = _kl_weights(check["lengths"], check.get("loss_type"))
    if weights.numel() != kl.numel():
        return 0.0
    kl, control_kl = _flat(kl), _flat(control_kl)
    total = abs(float(weights @ kl))
    return float(weights @ (control_kl - kl).abs()) / total if total else 0.0


def compare(reference: tuple[dict, dict], candidate: tuple[dict, dict], control: tuple[dict, dict]) -> dict:
    """Each (check, tensors) pair as checks.trainer writes them. Returns every quantity's difference, floor and
    verdict, and the first that differs with a sentence saying how."""
    ref, cand, ctl = (_values(*pair) for pair in (reference, candidate, control))
    rows = {}
    # The loss and its policy term are relative to the size of what they sum, where rounding acts: per token an
    # advantage (their mean magnitude) and the KL term. At ratio 1 the policy term is zero where a group's completions
    # are equally long, and its value then each stack's rounding of terms about |A| in size: measured against itself,
    # that rounding would read as a difference. The KL term, a sum of positive terms, is relative to itself.
    advantages = ref["advantages"]
    summands = (float(advantages.abs().mean()) if advantages is not None and advantages.numel() else 0.0) + \
        abs(ref["kl_term"])
    kl_reach = _kl_reach(ref["kl"], ctl["kl"], reference[0])  # the per-token KL noise, none of it cancelling
    clipped = min(reference[0]["clip_coefficient"], candidate[0]["clip_coefficient"]) < 1.0
    for name in (*ORDER, *TERMS):
        difference = _difference(name, cand[name], ref[name])
        floor = 0.0 if name in EXACT else (_difference(name, ctl[name], ref[name]) or 0.0)
        if name in CANCELLING and summands:
            difference, floor = abs(cand[name] - ref[name]) / summands, abs(ctl[name] - ref[name]) / summands
        # a scalar's one draw, or what the per-token floor can move it by, whichever is larger
        if name == "kl_term":
            floor = max(floor, kl_reach)
        elif name == "loss" and summands:
            floor = max(floor, kl_reach * abs(ref["kl_term"]) / summands)
        elif name == "clipping" and clipped:
            floor = max(floor, rows["gradient"]["floor"])
        threshold = max(FACTOR * floor, MIN_DIFFERENCE)
        row = {"difference": difference, "floor": floor, "threshold": threshold,
               "differs": difference is not None and difference > threshold}
        if name in ("gradient", "update", "loss", *TERMS):
            a, b = (_common(cand[name], ref[name]) if isinstance(cand[name], dict) else (cand[name], ref[name]))
            scalar = name in ("loss", *TERMS)
            na, nb = (abs(a), abs(b)) if scalar else (_norm(_flat(a)), _norm(_flat(b)))
            row["ratio"] = ((a / b) if scalar else (na / nb)) if nb else None
            row["zero"] = na == 0 and nb == 0
            if name in ("gradient", "update"):
                row["cosine"] = cosine(a, b)
                row["modules"] = _modules(cand[name], ref[name])
        rows[name] = row
    rows["loss"]["differs"] = any(rows[n]["differs"] for n in ("loss", *TERMS))
    first = next((name for name in ORDER if rows[name]["differs"]), None)
    if first == "loss" and [rows[t]["differs"] for t in TERMS].count(True) == 1:
        one = next(t for t in TERMS if rows[t]["differs"])
        other = rows[TERMS[1 - TERMS.index(one)]]["ratio"]
        # a term within rounding of zero shows a normalisation only as its ratio: the same factor is the loss's
        if other is None or abs(other - (rows[one]["ratio"] or 0.0)) > SAME_FACTOR * abs(other):
            first = one
    check_ref, check_cand = reference[0], candidate[0]
    missing = sorted(set(check_ref["trainable"]) ^ set(check_cand["trainable"]))
    return {"backend": check_cand["backend"], "reference": check_ref["backend"], "dtype": check_cand["dtype"],
            "reference_dtype": check_ref["dtype"], "control_dtype": control[0]["dtype"],
            "control_built_as": control[0].get("built_as", control[0]["backend"]), "factor": FACTOR,
            "completions": check_ref["completions"], "tokens": check_ref["tokens"],
            "with_advantage": check_ref.get("with_advantage"), "quantities": rows, "first": first,
            "only_in_one": missing, "said": said(first, rows, check_ref, check_cand)}


def _x(value, row: dict | None = None) -> str:
    """A ratio as said; a ratio of two zeros is said as such (a batch whose groups all tie has no policy term)."""
    if value is None:
        return "zero in both" if row and row.get("zero") else "not computed"
    return f"{value:.3g}x"


def said(first: str | None, rows: dict, reference: dict, candidate: dict) -> str:
    """One sentence: where the stacks part and by how much, or that every quantity agrees."""
    if first is None:
        return ("every quantity within its floor: the same log-probabilities, KL, advantages, loss, gradient, "
                "clipping, update and optimizer set-up")
    agree = [NAMES[n] for n in ORDER[:ORDER.index("loss" if first in TERMS else first)]]
    before = f"{', '.join(agree)} equal; " if agree else ""
    row = rows[first]
    if first == "loss":
        policy = _x(rows["policy_term"]["ratio"], rows["policy_term"])
        how = (f"loss {_x(row.get('ratio'))} the reference's, both its terms (policy {policy}, "
               f"KL {_x(rows['kl_term']['ratio'], rows['kl_term'])}): normalised by {candidate['normaliser']:.4g} "
               "where the reference "
               f"by {reference['normaliser']:.4g} (the settings' loss summed over {reference['tokens']} tokens, "
               "divided by the loss)")
    elif first in TERMS:
        other = TERMS[1 - TERMS.index(first)]
        how = (f"{NAMES[first]} {_x(row.get('ratio'))} the reference's, its {NAMES[other].split(' of ')[0]} "
               f"{_x(rows[other]['ratio'], rows[other])} (beta {reference['beta']:g}; "
               f"loss {_x(rows['loss']['ratio'])})")
    elif first in ("gradient", "update"):
        worst = min(((m, v) for m, v in row["modules"].items() if v["cosine"] is not None),
                    key=lambda item: item[1]["cosine"], default=(None, None))
        how = f"{NAMES[first]} {_x(row.get('ratio'))} the reference's norm, cosine {row['cosine']:.4f}"
        if worst[0]:
            how += f" (lowest {worst[1]['cosine']:.4f}, {worst[0]})"
    elif first == "clipping":
        how = (f"clip coefficient {candidate['clip_coefficient']:.4g} where the reference's is "
               f"{reference['clip_coefficient']:.4g} (gradient norm {candidate['grad_norm']:.4g} against "
               f"{reference['grad_norm']:.4g}, max_grad_norm {reference['max_grad_norm']})")
    elif first in EXACT:
        how = _setup(first, candidate, reference)
    else:
        how = f"{NAMES[first]} differ by {row['difference']:.3g} (relative; the floor {row['floor']:.3g})"
    # what the stacks are told to train can explain a gradient or an update that differs: said with it
    setup = [_setup(name, candidate, reference) for name in EXACT if rows[name]["differs"] and name != first]
    return before + how + (f"; and {'; '.join(setup)}" if setup else "")


def _setup(name: str, candidate: dict, reference: dict) -> str:
    return f"{NAMES[name]} differ: " + {
        "trainable": lambda: f"{candidate['trainable_numel']} trainable numbers against {reference['trainable_numel']}",
        "lora_scaling": lambda: f"scaling {candidate['lora_scaling']} against {reference['lora_scaling']}",
        "optimizer": lambda: f"{candidate['optimizer']['groups']} against {reference['optimizer']['groups']}",
        "schedule": lambda: "learning rates " + ", ".join(f"{a[0]:.3g}/{b[0]:.3g}" for a, b in zip(
            candidate["schedule"] or [], reference["schedule"] or [], strict=False)),
    }[name]()
