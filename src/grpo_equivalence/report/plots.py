"""The report's figures: per-step curves of every backend against the reference's seed band, and the speed
and memory of every backend. PNG, sized to be read without zooming."""

from pathlib import Path

from ..analysis import runs as run_files

# (panel title, metric of runs.METRIC_KEYS or a step key, y label)
PANELS = (("loss", "loss", "loss"), ("reward", "reward", "mean reward"), ("KL", "kl", "kl"),
          ("grad norm (before clipping)", "grad_norm", "grad_norm"),
          ("completion length", "completion_length", "tokens"), ("step time (log scale)", "wall_s", "s"))


def _series(run: dict, metric: str) -> list[float] | None:
    if metric == "wall_s":
        return [step["wall_s"] for step in run["steps"]]
    return run_files.series(run, metric)


def curves(runs: dict[str, list[dict]], reference: str, out: Path) -> None:
    """One step count: a panel per metric, a line per backend (its run with the study's seed), the
    reference's seeds shaded from their lowest to their highest value at each step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps_count = next(iter(runs.values()))[0]["max_steps"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), constrained_layout=True)
    colours = dict(zip(sorted(runs, key=lambda b: (b != reference, b)), plt.get_cmap("tab10").colors))
    for ax, (title, metric, unit) in zip(axes.flat, PANELS):
        for backend, backend_runs in sorted(runs.items(), key=lambda item: (item[0] != reference, item[0])):
            values = _series(backend_runs[0], metric)
            if values is None:
                continue
            x = ([step["step"] for step in backend_runs[0]["steps"]] if metric == "wall_s"
                 else run_files.logged_steps(backend_runs[0], metric))  # some metrics only at some steps
            if backend == reference and len(backend_runs) > 1:
                band = ([_series(r, metric) for r in backend_runs] if metric == "wall_s"
                        else run_files.aligned(backend_runs, metric))
                ax.fill_between(x, [min(v) for v in zip(*band)], [max(v) for v in zip(*band)], color=colours[backend],
                                alpha=0.2, label=f"{backend}: {len(backend_runs)} seeds, lowest to highest")
            ax.plot(x, values, color=colours[backend], linewidth=2.2 if backend == reference else 1.6,
                    label=f"{backend}{' (reference)' if backend == reference else ''}, seed {backend_runs[0]['seed']}")
        if metric == "wall_s":  # warm-up steps (compilation) can take minutes where the others take 0.1 s
            ax.set_yscale("log")
        ax.set_title(title, fontsize=13)
        ax.set_xlabel("step", fontsize=11)
        ax.set_ylabel(unit, fontsize=11)
        ax.tick_params(labelsize=10)
        ax.grid(alpha=0.3)
        if not ax.lines:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, fontsize=12)
    handles, labels = axes.flat[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(4, len(labels)), fontsize=11)
    fig.suptitle(f"{steps_count} steps: every backend against {reference}", fontsize=15)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def speed_memory(summaries: list[dict], reference: str, out: Path) -> None:
    """Median step time and peak device memory of every backend, a group of bars per step count; vLLM's
    up-front reservation hatched inside its memory bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = [s for s in summaries if s.get("gpu_alone") is not False]  # a run that shared its GPU: not comparable
    backends = sorted({s["backend"] for s in summaries}, key=lambda b: (b != reference, b))
    step_counts = sorted({s["max_steps"] for s in summaries}) or [0]
    by = {(s["backend"], s["max_steps"]): s for s in summaries}
    width = 0.8 / len(step_counts)
    colours = plt.get_cmap("Set2").colors
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(15, 6), constrained_layout=True)
    for i, steps in enumerate(step_counts):
        xs = [b + (i - (len(step_counts) - 1) / 2) * width for b in range(len(backends))]
        rows = [by.get((backend, steps)) for backend in backends]
        bars = speed.bar(xs, [r["median_step_s"] if r else 0 for r in rows], width, color=colours[i % len(colours)],
                         label=f"{steps} steps")
        speed.bar_label(bars, fmt="%.3g", fontsize=9)
        peaks = [r["peak_mem_gb"] if r and r["peak_mem_gb"] is not None else 0 for r in rows]
        bars = memory.bar(xs, peaks, width, color=colours[i % len(colours)], label=f"{steps} steps")
        memory.bar_label(bars, fmt="%.3g", fontsize=9)
        reserved = [r["vllm_reserved_gb"] if r and r.get("vllm_reserved_gb") else 0 for r in rows]
        memory.bar(xs, reserved, width, fill=False, hatch="//", edgecolor="0.3",
                   label="vLLM's up-front reservation" if i == 0 and any(reserved) else None)
    for ax, title, unit in ((speed, "median step (steps after warm-up)", "s"), (memory, "peak memory (GPU: device in use; CPU: resident set)", "GB")):
        ax.set_xticks(range(len(backends)), backends, fontsize=11)
        ax.set_title(title, fontsize=13)
        ax.set_ylabel(unit, fontsize=11)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=10)
    if not summaries:
        speed.text(0.5, 0.5, "no run had its GPU to itself", ha="center", va="center", transform=speed.transAxes)
    fig.suptitle(f"Speed and memory (reference: {reference})", fontsize=15)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
