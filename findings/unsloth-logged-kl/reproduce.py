"""Unsloth's GRPO loss logs as `kl` the mean of per-sequence means; TRL logs the token mean of the batch.

Both stacks log a metric named `kl` for the KL term of the GRPO loss (k3: exp(ref - new) - (ref - new) - 1 per
token). TRL (trl/trainer/grpo_trainer.py, `global_masked_mean`) logs the sum over every completion token of the
batch divided by their number. Unsloth's replacement of the loss (unsloth_zoo/rl_replacements.py,
`grpo_compute_loss`, its `masked_batch_mean`) logs each sequence's mean first and then their mean, so a short
completion weighs as much as a long one. The two agree only when every completion has the same length: comparing
the `kl` of two stacks compares two definitions.

    python reproduce.py                       # the unsloth_zoo installed here (it is not imported: only the
                                              # function's source is read from the file)
    python reproduce.py --unsloth-zoo WHEEL   # or the one in a wheel (unsloth_zoo-2026.10.9-py3-none-any.whl)

Needs torch; nothing of the workflow, no GPU. Exits 1 while Unsloth's logged value is not TRL's token mean on a
batch of completions of different lengths, printing both; 0 otherwise.
"""

import argparse
import ast
import importlib.util
import math
import sys
import zipfile
from pathlib import Path

FILE = "unsloth_zoo/rl_replacements.py"
FUNCTION = "grpo_compute_loss"


def source(wheel: str | None) -> tuple[str, str]:
    """The text of unsloth_zoo's rl_replacements.py, and where it came from (without importing unsloth_zoo, which
    needs a GPU)."""
    if wheel:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(FILE).decode(), f"{FILE} of {Path(wheel).name}"
    spec = importlib.util.find_spec("unsloth_zoo")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("unsloth_zoo is not installed here: pass --unsloth-zoo WHEEL (pip download --no-deps unsloth_zoo)")
    path = Path(next(iter(spec.submodule_search_locations))) / "rl_replacements.py"
    version = (path.parent / "__init__.py").read_text().split('__version__ = "', 1)[-1].split('"', 1)[0]
    return path.read_text(), f"{path} (unsloth_zoo {version})"


def unsloth_loss(text: str):
    """unsloth_zoo's grpo_compute_loss, compiled from its own source with torch and math as its only names."""
    import torch

    tree = ast.parse(text)
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == FUNCTION), None)
    if node is None:
        sys.exit(f"{FILE} has no {FUNCTION}: this script reads unsloth_zoo 2026.10")
    names = {"torch": torch, "math": math}
    exec(compile(ast.get_source_segment(text, node), FILE, "exec"), names)
    return names[FUNCTION]


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unsloth-zoo", default=None, help="an unsloth_zoo wheel (default: the installed one)")
    args = parser.parse_args()
    text, origin = source(args.unsloth_zoo)
    loss = unsloth_loss(text)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 12, 6, 9])  # four completions of different lengths, 12 positions each
    mask = (torch.arange(12)[None] < lengths[:, None]).float()
    new = -torch.rand((4, 12), generator=generator) * 2  # the policy's log-probabilities of the tokens
    ref = new + torch.randn((4, 12), generator=generator) * 0.3  # the reference model's
    advantages = torch.randn(4, generator=generator)
    _, _, logged, *_ = loss(ref, new, None, None, torch.zeros((4, 12), dtype=torch.long), mask, 0.04, advantages,
                            loss_type="dapo", num_items_in_batch=mask.sum())
    per_token = torch.exp(ref - new) - (ref - new) - 1
    token_mean = float((per_token * mask).sum() / mask.sum())  # TRL's global_masked_mean
    sequence_means = float(((per_token * mask).sum(1) / mask.sum(1)).mean())
    print(f"{FUNCTION} from {origin}; completions of {lengths.tolist()} tokens, beta 0.04, loss_type dapo")
    print(f"| kl | value |\n| --- | ---: |\n| Unsloth's logged kl | {float(logged):.6f} |\n"
          f"| token mean over the batch (what TRL logs) | {token_mean:.6f} |\n"
          f"| mean of per-sequence means | {sequence_means:.6f} |")
    same = math.isclose(float(logged), token_mean, rel_tol=1e-5)
    print("the same quantity as TRL's" if same else
          f"DIFFERENT QUANTITY: Unsloth logs the mean of per-sequence means ({float(logged) / token_mean:.3f}x TRL's "
          f"token mean here); compare a kl computed one way for both stacks")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
