# Whether the Unsloth stack's reference log-probabilities are the model's at a shifted position (run from the checkout).
import json, torch
from transformers import AutoModelForCausalLM
batch = json.load(open("results/trainer/batch.json"))
t = torch.load("results/trainer/unsloth_fi_false.pt")
stack = t["prepared"]["ref_per_token_logps"]
model = AutoModelForCausalLM.from_pretrained("results/tiny/primed", dtype=torch.float32).eval()
for i in range(2):
    p, c = batch["prompt_ids"][i], batch["completion_ids"][i]
    ids = torch.tensor([p + c])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    P, n = len(p), len(c)
    aligned = [logp[P - 1 + k, c[k]].item() for k in range(n)]
    own = [logp[P + k, c[k]].item() if P + k < ids.shape[1] else None for k in range(n)]  # label = its own position
    back = [logp[P - 2 + k, c[k]].item() for k in range(n)]
    print("row", i, "stack  ", [round(x, 3) for x in stack[i, :n].tolist()])
    print("row", i, "aligned", [round(x, 3) for x in aligned])
    print("row", i, "shift+1", [None if x is None else round(x, 3) for x in own])
    print("row", i, "shift-1", [round(x, 3) for x in back])
    uniform = -torch.log(torch.tensor(float(logp.shape[-1]))).item()
    print("uniform", round(uniform, 3), "vocab", logp.shape[-1])
for name in ("hf_vs_unsloth_fi_false",):
    c = json.load(open(f"results/trainer/{name}.json"))
    q = c["quantities"]
    print(name, {k: {kk: (round(vv, 5) if isinstance(vv, float) else vv) for kk, vv in v.items() if kk != "modules"}
                 for k, v in q.items()})
