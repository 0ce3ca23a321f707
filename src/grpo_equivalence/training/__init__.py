"""One GRPO run: the trainer built for a backend (session), trained and recorded (train, recorder, runwarnings), on
one or several processes (parallel); the backends (backends/) and the native decoder (decoder/); rewards, data,
the answer format, the tiny and random models and their priming; injected faults (faults); the GRPOConfig fields
a study may set (grpo_fields)."""
