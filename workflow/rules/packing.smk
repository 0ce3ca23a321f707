# GPU jobs as Snakemake schedules them: what they count of --resources gpu=N, what their lease needs, and
# which runs a packed job waits for (src/grpo_equivalence/study/gpushare.py does the rest in the job).


# Several jobs on one GPU (gpu_sharing): run locally, they count no GPUs in Snakemake (the lease fits them onto
# the devices by memory and slots, within --resources gpu=N); on a cluster each job is an allocation of its own.
PACKS = gpushare.packs(config)


def gpu_resource():
    """The `gpu` resource of the jobs that train or sample on a GPU."""
    return 0 if PACKS and workflow.local_exec else config["gpus_per_train_job"]


def gpu_io(name, alone):
    """What a GPU job's lease needs (io, so that packing reruns nothing): the sharing settings, whether this
    run must have its GPU to itself, the GPUs Snakemake may use (--resources gpu=N), and the job's name in the
    other jobs' records of who shared their GPU."""
    limit = workflow.global_resources.get("gpu")
    limit = getattr(limit, "value", limit)
    return {"gpu_sharing": config["gpu_sharing"], "alone": alone, "max_gpus": limit if isinstance(limit, int) else None,
            "run": name, "stats_dir": os.path.dirname(out(paths.STATS))}


def measured_first(backend, steps):
    """A packed job whose memory is to be measured waits for the study's seed run of its backend: that run takes
    a GPU of its own and measures what the others then ask for (ancient: the order only; a retrained run reruns
    none of them, and the run cache's key leaves it out)."""
    if PACKS and config["gpu_sharing"]["memory_gb"] is None:
        return {"measured": ancient(out(paths.STATS).format(backend=backend, steps=steps))}
    return {}


def speed_run_last(backend, steps):
    """With speed_runs: last, the study's seed run waits for the other seeds (which compiled what it needs), so
    that it runs alone with warm caches: the other seeds of every backend and step count, not only its own. A run
    alone empties its GPU first, and speed runs let in between packed ones would empty it once for each."""
    if PACKS and config["gpu_sharing"]["speed_runs"] == "last":
        return {"measured": [ancient(p) for b in BACKENDS for n in STEPS for p in runs_of(b, n)[1:]]}
    return {}


def keyed_inputs(input):
    """A job's input files but the runs it only waited for (measured_first, speed_run_last): what keys its caches."""
    waited = input.get("measured") or []
    waited = {str(waited)} if isinstance(waited, str) else set(map(str, waited))
    return [str(f) for f in input if str(f) not in waited]
