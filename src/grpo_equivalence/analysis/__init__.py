"""Statistics files and what is derived from them: the contract (stats), runs grouped and read per metric (runs),
summaries (summary), comparisons (compare), the training verdict (verdict, sequential) and its calibration on
synthetic runs (calibration)."""
