# How each stack lays out the reference log-probabilities its loss reads (run from the checkout, after the trainer check).
import torch, json, sys
for name in ("hf", "unsloth_fi_false"):
    t = torch.load(f"results/trainer/{name}.pt")
    c = json.load(open(f"results/trainer/{name}.json"))
    p = t["prepared"]
    print(name, {k: (tuple(v.shape), str(v.dtype)) if hasattr(v, "shape") else v for k, v in p.items()})
    ref, mask = p.get("ref_per_token_logps"), p.get("completion_mask")
    indep_ref, indep_pol = t["reference_logps"], t["policy_logps"]
    batch = json.load(open("results/trainer/batch.json"))
    lengths = [len(x) for x in batch["completion_ids"]]
    print("  lengths", lengths, "mask sums", mask.sum(1).tolist() if mask is not None else None)
    if ref is None:
        continue
    rows, start = [], 0
    for i, n in enumerate(lengths):
        rows.append((indep_ref[start:start + n], indep_pol[start:start + n])); start += n
    for i in range(3):
        r, pol = rows[i]
        print(f"  row {i}: stack ref", [round(x, 4) for x in ref[i, :lengths[i] + 2].tolist()])
        print(f"  row {i}: indep ref", [round(x, 4) for x in r.tolist()])
        print(f"  row {i}: indep pol", [round(x, 4) for x in pol.tolist()])
    old = p.get("old_per_token_logps")
    if old is not None:
        print("  old row 0", [round(x, 4) for x in old[0, :lengths[0]].tolist()])
