"""One run on several GPUs: data-parallel training, a process per leased GPU (torchrun), the train job's own
bookkeeping (lease, run cache, statistics file) staying in the job's process.

A train job whose study sets gpus_per_train_job: N > 1 leases N GPUs and starts N processes on them through
torch.distributed.run; accelerate, under TRL, sees their ranks and trains with DistributedDataParallel (NCCL on
GPUs, gloo on the CPU). Each process generates and scores its share of the batch, TRL gathers the logged metrics
over all of them, and process 0 hands the run's statistics back to the job, which writes them as a one-process
run's. Its memory figures are process 0's device's. Backends say whether they can (Backend.data_parallel): the
ones whose trainer or rollout engine assumes one process are refused before any job (config.check).
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


def processes(config: dict) -> int:
    """How many processes train one run: one per GPU of the job."""
    return max(1, config["gpus_per_train_job"])


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def launch(config: dict, backend: str, steps: int, *, model_path: str, dataset: dict, study: str, adapter,
           threads: int, log=print) -> dict:
    """Trains one run on processes(config) processes and returns its statistics (process 0's, unwritten).
    Raises RuntimeError naming the log lines to read if a process fails."""
    count = processes(config)
    with tempfile.TemporaryDirectory(prefix="grpo_parallel_") as scratch:
        request, result = Path(scratch) / "run.json", Path(scratch) / "result.json"
        request.write_text(json.dumps({
            "config": config, "backend": backend, "steps": steps, "model_path": model_path, "dataset": dataset,
            "study": study, "adapter": None if adapter is None else str(adapter), "result": str(result),
            "threads": max(1, threads // count)}))
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={count}",
                   "-m", "grpo_equivalence.training.parallel", str(request)]
        log(f"[{backend} x {steps}] training on {count} processes (data parallel)")
        worker = subprocess.Popen(command)
        # The job's end (Snakemake's stop, the workflow gone) ends the processes too: torchrun passes it on
        previous = signal.signal(signal.SIGTERM, lambda *_: worker.terminate())
        try:
            code = worker.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
        if code != 0 or not result.exists():
            raise RuntimeError(f"training on {count} processes failed (exit {code}): the lines of each rank above "
                               f"say why")
        return json.loads(result.read_text())


def main(request_path: str) -> None:
    """One process of a data-parallel run (started by launch through torchrun)."""
    import torch

    from ..analysis import stats
    from . import train

    request = json.loads(Path(request_path).read_text())
    torch.set_num_threads(request["threads"])
    if torch.cuda.is_available():  # "cuda" in this process is its own GPU of the lease: the model loads there
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # Process 0 hands its statistics back; every process trains, none writes the run's file
    write = (lambda path, result: Path(request["result"]).write_text(stats.to_json(result))) if rank() == 0 else \
        (lambda path, result: None)
    train.run(request["config"], request["backend"], request["steps"], model_path=request["model_path"],
              dataset=request["dataset"], out=Path(request["result"]), study=request["study"],
              adapter=None if request["adapter"] is None or rank() != 0 else Path(request["adapter"]), write=write,
              log=print if rank() == 0 else (lambda message: None))


if __name__ == "__main__":
    main(sys.argv[1])
