"""Is Unsloth's cap of each token's KL at 10 why its trainer check's KL term falls below TRL's?
(docs/findings.md: Unsloth's GRPO loss caps each token's KL at 10.)

Runs `hf`'s trainer check (TRL + PEFT, which does not cap) on the batch a committed GPU example's trainer check used,
on this machine, and prints the per-token k3 of that batch, its largest values, and the share of the KL term that a
cap at 10 leaves, beside the ratio of the example's Unsloth check to its `hf` check. Needs the tiny model
(`snakemake --cores 2 --config study=studies/tiny.yaml -- results/tiny/primed`).

    python benchmarks/kl_clamp_share.py [EXAMPLE] [OUTDIR]   (default docs/examples/h100-fresh-seeds-decision, /tmp/kl)
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CAP = 10.0  # unsloth_zoo's clamp of the per-token KL term (grpo_compute_loss)


def main(argv: list[str]) -> dict:
    import torch

    from grpo_equivalence.checks import trainer
    from grpo_equivalence.runtime import paths
    from grpo_equivalence.study.config import load_study

    example = Path(argv[0]) if argv else ROOT / "docs/examples/h100-fresh-seeds-decision"
    out = Path(argv[1]) if len(argv) > 1 else Path("/tmp/kl")
    study = load_study(example / "study.yaml")
    settings = {k: study.get(k) for k in ("model", "dataset", "system_prompt", "rewards", "chat_template", "dtype",
                                          "max_seq_length", "lora", "grpo", "recorder")}
    model = str(ROOT / "results/tiny/primed")
    settings.update(gpus_per_train_job=0, backend_options={"hf": {}}, model=model)
    dataset = {**study["dataset"], "path": "json", "data_files": str(ROOT / paths.TINY_DATA), "name": None}
    out.mkdir(parents=True, exist_ok=True)
    trainer.check(settings, "hf", model_path=model, dataset=dataset,
                  batch=json.loads((example / "trainer/batch.json").read_text()), max_steps=max(study["steps"]),
                  out=out / "hf.json", tensors=out / "hf.pt")
    k3 = torch.load(out / "hf.pt")["kl"].float().flatten()
    checks = {name: json.loads((example / f"trainer/{name}.json").read_text()) for name in ("hf", "unsloth_fi_false")}
    result = {"tokens": k3.numel(), "largest": [round(float(x), 3) for x in k3.sort(descending=True).values[:5]],
              "share_left_by_the_cap": float(k3.clamp(max=CAP).sum() / k3.sum()),
              "example_unsloth_over_hf": checks["unsloth_fi_false"]["kl_term"] / checks["hf"]["kl_term"]}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
