# Reads the probe's records (sitecustomize.py) beside the check's own tensors: what the tensor Unsloth decided on is
# (the model's logits, or hidden states), and what each decision makes of it. Usage: read_probe.py PROBE CHECK.pt
import sys

import torch

records, check = torch.load(sys.argv[1], weights_only=False), torch.load(sys.argv[2], weights_only=False)
model = check["reference_logps"].float().flatten()  # the reference model's own, completion order (same code, TRL)
read = check["stack_reference_logps"]
print("tokens", model.numel(), "model's reference log-probs, first 8:", [round(x, 3) for x in model[:8].tolist()])
if read is not None:
    print("Unsloth's loss reads, first 8:          ", [round(x, 3) for x in read[:8].tolist()])
for i, r in enumerate(records):
    print(f"\n#{i} {r['module']}.{r['caller']} line {r['line']}: decision hidden={r['decision']} signal={r['signal']} "
          f"adapter off={r['adapters_disabled']} grad={r['grad']} shape={r['shape']} head={tuple(r['head'].shape)}")
    print("   markers", r["markers"])
    x, ids, head = r["tensor"], r["ids"], r["head"]
    if ids is None or ids.shape != x.shape[:2]:
        print("   ids", None if ids is None else tuple(ids.shape), "(not aligned with the tensor: not read)")
        continue
    as_logits = torch.log_softmax(x, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1).flatten()
    as_hidden = torch.log_softmax(x @ head.T, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1).flatten()
    print("   |x| mean", round(float(x.abs().mean()), 3), "row norm", round(float(x.norm(dim=-1).mean()), 3))
    print("   taken as logits, first 8:", [round(v, 3) for v in as_logits[:8].tolist()])
    print("   taken as hidden, first 8:", [round(v, 3) for v in as_hidden[:8].tolist()])
    if as_logits.numel() == model.numel():
        for name, values in (("as logits", as_logits), ("as hidden", as_hidden)):
            gap_model = (values - model).abs().median()
            gap_read = (values - read).abs().median() if read is not None else float("nan")
            print(f"   {name}: median |. - model| {gap_model:.4f}, median |. - Unsloth's read| {gap_read:.4f}")
