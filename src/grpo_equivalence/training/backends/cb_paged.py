from dataclasses import dataclass

from .base import Backend


@dataclass(frozen=True)
class ContinuousBatching(Backend):
    def grpo_overrides(self, options: dict) -> dict:
        # Without explicit sizes, continuous batching sizes its paged KV cache from the device's free
        # memory; on a CPU that means gigabytes zeroed per generate call, so the tiny study sets them.
        return {
            "use_transformers_continuous_batching": True,
            "transformers_continuous_batching_config": dict(options.get("continuous_batching") or {}) or None,
        }


BACKEND = ContinuousBatching(
    name="cb_paged",
    summary="vanilla transformers + PEFT, continuous batching with paged attention (generate_batch)",
    options={"continuous_batching": "transformers.ContinuousBatchingConfig keyword arguments"},
    data_parallel=True,
)
