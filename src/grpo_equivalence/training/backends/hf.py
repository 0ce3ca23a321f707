from .base import Backend

BACKEND = Backend(name="hf", summary="vanilla transformers + PEFT, plain padded generate()", data_parallel=True,
                  sampler_logits="generate")
