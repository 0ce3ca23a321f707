"""GRPO rollout-backend equivalence: train, record, summarise, compare, report."""
