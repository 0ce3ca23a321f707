"""vLLM 0.26's top-k/top-p kernel as a rule on exact filters, and transformers' generate() filtering by it: the
drop_weakest fault, a CPU stand-in for a vLLM sampler (docs/findings.md: the defect, and a script that shows it);
and trl_vllm's exact_top_p, which takes the kernel out of vLLM's sampler."""

import contextlib

# Where the engine samples through vLLM's PyTorch top-k/top-p function (TRL's engine: it asks for processed
# log-probabilities, so neither model runner takes FlashInfer's sampler)
EXACT_TOP_P = {"exact_top_p": "true: top_k and top_p by vLLM's sort-based filter at every batch size, not its Triton "
                              "kernel (8 sequences a step and more), which drops the last token min_p left where "
                              "top_p needs it (vLLM 0.26: docs/backends.md); false (the default): vLLM as it is"}
# The module whose top-k/top-p function vLLM's PyTorch sampler looks up at each step, and its sort-based one
SAMPLER_MODULE = "vllm.v1.sample.ops.topk_topp_sampler"


def drop_weakest(candidates, kept, survivors, top_k, top_p):
    """vLLM 0.26's top-k/top-p kernel (vllm/v1/sample/ops/topk_topp_triton.py), as a rule on what exact filters
    give: `candidates` the logits top-p chose among (after temperature, top_k and min_p; -inf where dropped), `kept`
    the exact filters' result, `survivors` how many tokens min_p alone left. With a top_p below 1, where no more than
    top_k survived min_p (the kernel then takes its top-p path alone, which bisects for a threshold and never keeps
    the smallest of its range) and top-p kept every candidate and there are several, the weakest is dropped. In place
    on `kept`, which it returns (docs/findings.md measures the rule against the kernel)."""
    import torch

    if top_p is None or top_p >= 1.0:  # vLLM asks no top-p of the kernel
        return kept
    among = torch.isfinite(candidates)
    alone = survivors <= top_k if top_k else torch.ones_like(survivors, dtype=torch.bool)
    rows = (alone & (torch.isfinite(kept) == among).all(-1) & (among.sum(-1) > 1)).nonzero().squeeze(1)
    weakest = torch.where(among, candidates, torch.full_like(candidates, float("inf"))).argmin(-1)
    kept[rows, weakest[rows]] = -float("inf")
    return kept


@contextlib.contextmanager
def dropping_weakest_in_generate(trainer=None):
    """install_in_generate for the block, and generate() as it was after it."""
    restore = install_in_generate(trainer)
    try:
        yield
    finally:
        restore()


def install_in_generate(trainer=None):
    """transformers' generate() in this process filters by drop_weakest from now on: its top-k and top-p warpers
    keep what they were given, and its min-p warper (the last filter) applies the rule. Only the names
    transformers.generation.utils builds generate()'s warpers from are replaced, not the classes anything else
    uses; a vLLM or native rollout does not sample through them and is refused. Returns what puts them back."""
    import torch
    from transformers.generation import logits_process, utils

    if trainer is not None and (getattr(trainer, "vllm_generation", None) is not None or
                                getattr(trainer, "use_transformers_continuous_batching", False) or
                                not hasattr(trainer, "generation_config")):
        raise ValueError("drop_weakest is put into transformers' generate() (hf, hf_static); vLLM 0.26 does it itself "
                         "(trl_vllm without exact_top_p)")
    given = {}

    class TopKRemembering(logits_process.TopKLogitsWarper):
        def __call__(self, input_ids, scores):
            given["whole"], given["top_k"] = scores.clone(), self.top_k
            return super().__call__(input_ids, scores)

    class TopPRemembering(logits_process.TopPLogitsWarper):
        def __call__(self, input_ids, scores):
            given["candidates"], given["top_p"] = scores.clone(), self.top_p
            return super().__call__(input_ids, scores)

    class MinPThenRule(logits_process.MinPLogitsWarper):
        def __call__(self, input_ids, scores):
            kept = super().__call__(input_ids, scores)
            whole, top_k = given.pop("whole", None), given.pop("top_k", None)
            if "candidates" not in given:  # no top_p this step: nothing for the kernel to cut
                return kept
            candidates = super().__call__(input_ids, given.pop("candidates"))
            survivors = torch.isfinite(super().__call__(input_ids, whole if whole is not None else candidates.clone()))
            return drop_weakest(candidates, kept, survivors.sum(-1), top_k, given.pop("top_p"))

    own = utils.TopKLogitsWarper, utils.TopPLogitsWarper, utils.MinPLogitsWarper
    utils.TopKLogitsWarper, utils.TopPLogitsWarper, utils.MinPLogitsWarper = TopKRemembering, TopPRemembering, MinPThenRule

    def restore():
        utils.TopKLogitsWarper, utils.TopPLogitsWarper, utils.MinPLogitsWarper = own

    return restore


def exact_top_p(options: dict, backend: str) -> list[str]:
    """With `exact_top_p: true` among the backend's options, vLLM's top-k/top-p function in this process (the
    engine runs in it) becomes its sort-based one at every batch size, which keeps what top_p asks; returns the
    rollout setting changed, as the report names it. The engine is built by then, and a module that imported the
    function by name keeps its own binding: vLLM 0.26's model runner V2 (its default for dense models) samples
    through vllm.v1.worker.gpu.sample.sampler's, which replacing SAMPLER_MODULE's alone left on the Triton kernel
    (docs/findings.md). Every loaded vLLM module that holds the kernel's dispatcher is pointed at the sort-based one."""
    if not options.get("exact_top_p"):  # a flag: the study's validation refuses anything but true or false
        return []
    import importlib
    import sys

    sampler = importlib.import_module(SAMPLER_MODULE)
    sort_based = getattr(sampler, "apply_top_k_top_p_pytorch", None)
    if sort_based is None or not hasattr(sampler, "apply_top_k_top_p"):
        raise RuntimeError(f"backend_options.{backend}.exact_top_p: this vLLM has no apply_top_k_top_p_pytorch in "
                           f"{SAMPLER_MODULE} (vLLM 0.26 has); leave the option out with this vLLM")
    dispatcher = sampler.apply_top_k_top_p
    for name, module in list(sys.modules.items()):
        if (name == "vllm" or name.startswith("vllm.")) and getattr(module, "apply_top_k_top_p", None) is dispatcher:
            module.apply_top_k_top_p = sort_based
    return ["vllm.exact_top_p"]
