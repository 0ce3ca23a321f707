"""How often the trainer check flags a correct candidate (grpo_equivalence.checks.trainer_verdict), under the error
model its floor measures: the candidate's kernels err independently of the reference's, as much as the reference's
own precision change does. A quantity of n numbers then differs by ||e_c - e_r|| / ||e_r|| times its floor, with
e_c and e_r independent standard normal vectors. Prints, per n: the chance FACTOR (2) flags it, alone and as one of
the loss stage's three scalars (the loss and its two terms), and the factors that would hold 5 % a stage (the
quantiles at 1 - 5 % and 1 - 5 %/3).

    python benchmarks/trainer_false_flags.py [DRAWS]   (default 400000)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from grpo_equivalence.checks import trainer_verdict  # noqa: E402


def ratios(numbers: int, draws: int, rng):
    import numpy as np

    candidate, reference = rng.standard_normal((draws, numbers)), rng.standard_normal((draws, numbers))
    return np.linalg.norm(candidate - reference, axis=1) / np.linalg.norm(reference, axis=1)


def main() -> None:
    import numpy as np

    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 400_000
    rng = np.random.default_rng(20261205)
    factor = trainer_verdict.FACTOR
    print(f"error model, {draws} draws a row")
    print(f"| numbers | flagged at factor {factor:g}, alone | the loss stage (3 such quantities) | factor for 5 % alone "
          "| factor for 5 % a loss stage |\n| ---: | ---: | ---: | ---: | ---: |")
    for numbers in (1, 2, 3, 5, 10, 20, 50, 100, 1000):
        r = ratios(numbers, draws, rng)
        stage = 1 - np.mean([(ratios(numbers, draws, rng) <= factor).mean() for _ in range(3)]) ** 3
        print(f"| {numbers} | {100 * (r > factor).mean():.1f} % | {100 * stage:.1f} % | {np.quantile(r, 0.95):.2f} | "
              f"{np.quantile(r, 1 - 0.05 / 3):.2f} |")


if __name__ == "__main__":
    main()
