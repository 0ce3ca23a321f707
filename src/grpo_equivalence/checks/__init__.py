"""Checks at fixed weights, before any training: the rollout check (rollout) and its verdicts (rollout_verdict)."""
