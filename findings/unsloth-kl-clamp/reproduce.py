"""Unsloth's GRPO loss caps each token's KL term at 10; TRL's does not: where a token's KL exceeds 10, Unsloth's loss
holds less KL than TRL's from the same log-probabilities.

The KL term of the GRPO loss is beta x k3 per token, k3 = exp(ref - new) - (ref - new) - 1. TRL
(trl/trainer/grpo_trainer.py, `_compute_loss`) adds it to the per-token loss as it is. Unsloth's replacement of the
loss (unsloth_zoo/rl_replacements.py, `grpo_compute_loss`) clamps it first, `kl_i = torch.clamp(kl_i, min=-10.0,
max=10.0)`, commented "cap the final KL term (TRL does not clamp)". A token whose reference model gives it e^3 times
the policy's probability or more (ref - new >= 2.84) has k3 above 10 and counts as 10 in Unsloth's loss: its gradient
through the KL term is cut too. On the project's tiny study (an H100, bfloat16, seed 7301) one token of 77 had k3 =
17.5, and Unsloth's KL term of the loss was 0.81x TRL's, every per-token quantity equal (docs/trainer-check.md).

    python reproduce.py                       # the unsloth_zoo installed here (only the function's source is read)
    python reproduce.py --unsloth-zoo WHEEL   # or the one in a wheel (unsloth_zoo-2026.10.9-py3-none-any.whl)

Needs torch; nothing of the workflow, no GPU. Exits 1 while Unsloth's KL term differs from TRL's on a batch with one
token of k3 above 10, printing both; 0 otherwise.
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
    # two completions of 4 tokens; the policy equals the reference but at one token, where the reference gives it
    # e^3.5 = 33 times the policy's probability (k3 = 28.6)
    new = torch.full((2, 4), -1.0)
    ref = new.clone()
    ref[0, 1] += 3.5
    mask = torch.ones((2, 4))
    advantages = torch.zeros(2)  # no policy term: the loss is the KL term alone
    beta = 0.04
    unsloth = loss(ref, new, None, None, torch.zeros((2, 4), dtype=torch.long), mask, beta, advantages,
                   loss_type="dapo", num_items_in_batch=mask.sum())[0]
    k3 = torch.exp(ref - new) - (ref - new) - 1
    trl = float((beta * k3 * mask).sum() / mask.sum())  # TRL's dapo loss at zero advantage
    print(f"{FUNCTION} from {origin}; 8 tokens, one with k3 = {float(k3.max()):.2f}, beta {beta}, loss_type dapo, "
          f"zero advantages (the loss is its KL term)")
    print(f"| KL term of the loss | value |\n| --- | ---: |\n| Unsloth's | {float(unsloth):.6f} |\n"
          f"| TRL's (k3 as it is) | {trl:.6f} |\n| k3 capped at 10 | {float((beta * k3.clamp(max=10) * mask).sum() / mask.sum()):.6f} |")
    same = math.isclose(float(unsloth), trl, rel_tol=1e-5)
    print("the same KL term as TRL's" if same else
          f"DIFFERENT LOSS: Unsloth's KL term is {float(unsloth) / trl:.3f}x TRL's here: it caps each token's k3 at 10")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
