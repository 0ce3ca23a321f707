import json

from grpo_equivalence import prime
from grpo_equivalence.joblog import to_log

with to_log(snakemake.log[0]):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(snakemake.threads)
    t = snakemake.params.tiny
    model = AutoModelForCausalLM.from_pretrained(snakemake.input.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(snakemake.input.model)
    with open(snakemake.input.data) as f:
        rows = [json.loads(line) for line in f]
    prime.prime(model, tokenizer, rows, system_prompt=snakemake.params.system_prompt, steps=t["prime_steps"],
                batch_size=t["prime_batch_size"], learning_rate=t["prime_learning_rate"], seed=t["seed"])
    model.save_pretrained(snakemake.output[0])
    tokenizer.save_pretrained(snakemake.output[0])
