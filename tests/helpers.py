"""Hand-made statistics files in the contract's shape, for testing what is derived from them."""

from grpo_equivalence.analysis import stats

# A rollout check of a few prompts, for the tests that exercise the workflow rather than the check itself
SMALL_ROLLOUT_CHECK = {"prompts": 8, "prompts_per_call": 8}


def make_stats(backend="hf", n=6, *, wall=None, loss=None, reward=None, kl=None, grad_norm=None, peak=1.0, seed=3407):
    steps = []
    for i in range(1, n + 1):
        steps.append({
            "step": i,
            "wall_s": wall(i) if wall else 1.0 + i / 10,
            "loss": loss(i) if loss else 0.1 * i,
            "grad_norm": grad_norm(i) if grad_norm else 0.5,
            "reward": reward(i) if reward else float(i),
            "kl": kl(i) if kl else 0.01 * i,
            "peak_mem_gb": peak + i / 100,
            "metrics": {"frac_reward_zero_std": 0.25, "entropy": 1.0, "completions/mean_length": 10.0},
        })
    return {
        "schema_version": stats.SCHEMA_VERSION, "backend": backend, "max_steps": n, "seed": seed, "model": "m",
        "dataset": "d", "train_wall_s": 10.0 * n, "peak_mem_gb": max(s["peak_mem_gb"] for s in steps), "steps": steps,
        "effective_config": {"trainer": {"beta": 0.001}, "lora": None, "generation": None},
        "environment": {"packages": {"trl": "1.16.0"}, "gpu_name": None, "gpu_count": 0, "git_commit": "abc"},
    }


def _cells(line: str) -> list[str]:
    # A cell may hold an escaped pipe (\|), which does not split it
    import re

    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def markdown_tables(text: str) -> list[dict]:
    """Every Markdown table of `text`: its header cells and its rows' cells, in order."""
    tables, lines = [], text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and lines[i + 1].startswith("| ---") and not (i and lines[i - 1].startswith("|")):
            rows = []
            for body in lines[i + 2:]:
                if not body.startswith("|"):
                    break
                rows.append(_cells(body))
            tables.append({"header": _cells(line), "rows": rows})
    return tables


def tables_headed(text: str, *first_cells: str) -> list[dict]:
    """The tables whose header starts with `first_cells`, as lists of {column: cell} rows."""
    found = []
    for table in markdown_tables(text):
        if table["header"][: len(first_cells)] == list(first_cells):
            found.append([dict(zip(table["header"], row, strict=True)) for row in table["rows"]])
    return found
