"""Per-step memory, measured the same way for every backend: reset at step start, read at step end.

On CUDA three figures, because backends reserve memory differently (vLLM up front, continuous batching
a KV-cache fraction): peak allocated and peak reserved by PyTorch's allocator, and device memory in use
by the whole process as the driver sees it (which includes what is reserved outside PyTorch's allocator).
On the CPU, the resident-set high-water mark of the process, reset through /proc/self/clear_refs.
GB means 1e9 bytes.
"""

GB = 1e9


class MemoryProbe:
    def __init__(self, device: str):
        self.device = device
        self._rss_resettable = device == "cpu" and self._reset_rss()

    def reset(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        elif self._rss_resettable:
            self._reset_rss()

    def read(self) -> dict:
        """The step's figures; `peak_mem_gb` is the one the summary and report use."""
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            free, total = torch.cuda.mem_get_info()
            allocated = torch.cuda.max_memory_allocated() / GB
            reserved = torch.cuda.max_memory_reserved() / GB
            device_used = (total - free) / GB
            # The driver's figure is read at step end; what the allocator reserved above its current
            # reservation during the step was in use too, so add it to get the step's device peak.
            peak = device_used + reserved - torch.cuda.memory_reserved() / GB
            return {"peak_mem_gb": peak, "peak_allocated_gb": allocated, "peak_reserved_gb": reserved,
                    "device_used_gb": device_used}
        return {"peak_mem_gb": self._rss_peak_gb()}

    def describe(self) -> str:
        if self.device == "cuda":
            return "CUDA: device memory in use at step end plus the allocator's growth during the step"
        if self._rss_resettable:
            return "CPU: peak resident set size of the training process during the step (VmHWM, reset each step)"
        return "CPU: peak resident set size of the training process since it started (VmHWM; reset not permitted)"

    @staticmethod
    def _reset_rss() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    @staticmethod
    def _rss_peak_gb() -> float | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024 / GB
        except OSError:
            pass
        return None  # not measurable here: reported as not logged


def device_bandwidth_gbs(gigabytes: float = 1.0, repeats: int = 20) -> float:
    """The GPU's memory bandwidth as a device-to-device copy achieves it (bytes read plus bytes written per
    second, GB/s): what a decode step that reads every weight once can at best stream."""
    import torch

    n = int(gigabytes * GB) // 2
    source = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    target = torch.empty_like(source)
    target.copy_(source)  # first touch outside the timing
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        target.copy_(source)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1000
    del source, target
    torch.cuda.empty_cache()
    return 2 * n * 2 * repeats / seconds / GB
