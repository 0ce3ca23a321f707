"""The study: its file read and checked before any job (config, validate, inputs), and what the workflow decides for
each of its jobs: what it asks of a GPU (gpushare), whether its run is already done (runkey, runcache), and its
priority (schedule)."""
