"""GRPO rollout-backend equivalence: train, record, summarise, compare, report.

The package's parts, each importing only those listed before it (tests/test_layout.py keeps it so):

- runtime:  what a job runs on: GPU leases and the quiet lock, the job's tie to the workflow, the job server of a
            CPU study, memory probes, the environment a run records, the code hash that reruns a job, the workflow's
            paths;
- analysis: statistics files and what is derived from them: summaries, comparisons, verdicts, their calibration;
- training: one run: backends, the native decoder, rewards, data, faults, priming, the tiny and random models, the
            trainer's set-up and the recorder of its steps;
- study:    the study file and its checks, and what the workflow decides for each job: the GPU it asks for, its
            run cache entry, its priority;
- checks:   checks at fixed weights: the rollout check and its verdicts;
- report:   the report's sections, its rendering and its figures;
- cli:      grpo-summarise, grpo-compare, grpo-report.
"""
