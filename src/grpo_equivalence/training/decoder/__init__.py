"""A plain PyTorch decoder for the rollout of Qwen3 and Llama models (backend `native`): model holds the decoder,
weights the merged weights, kernels a decode layer's compiled halves, state a batch's buffers and graphs, sampling
the warpers and the draw.

The policy's weights are read from the trainer's model with every LoRA adapter merged into a copy (the trainer's
weights are never changed), fused where a step reads them together (q, k and v; gate and up), and refreshed
whenever a trainable weight changed in place (an optimizer step, or a fault that swaps them for the rollout).
Prompts are left-padded as TRL pads them and get per-sequence positions as transformers' generate() gives
them; the KV cache is static, sized to prompt + completion. Sampling is transformers' own warpers, in
generate()'s order, on float32 logits, so the distribution is the one the study's settings define: the rollout
check judges it against `hf`.

On a GPU the decode step is compiled and replayed as CUDA graphs: the projections and norms of a layer are one
compiled function and its attention and MLP another, each compiled once for every layer, the attention for any
length of cache. The cache writes, the attention mask and the sampling run between them as plain kernels, and a
graph holds them all, so a step costs no Python. There is one KV cache per batch size (grown when a longer prompt
comes) and one graph per attention window: a step attends over the first WINDOW-multiple of cache slots that
holds every token so far, not over the whole cache. On the CPU every step is eager.
Sampling draws among the top_k + TIES largest logits (the tokens top_k keeps, and ties with the k-th) with
transformers' own warpers, which is the distribution of the warpers over the whole vocabulary; without top_k it
uses the whole vocabulary.
"""
