"""The study's four reward functions, with Unsloth's scoring.

TRL names each reward metric after the function's `__name__` (`rewards/<name>/mean`), so the functions
keep the study's names. They depend on the tokenizer's EOS token (the exact-format regex allows it at
the end), hence the factory.
"""

from .answer_format import MATCH_NUMBERS, REASONING_END, SOLUTION_END, SOLUTION_START, match_format

REWARD_NAMES = ("match_format_exactly", "match_format_approximately", "check_answer", "check_numbers")


def _text(completion) -> str:
    # Conversational data sets give a list of messages per completion, plain ones a string.
    return completion[0]["content"] if isinstance(completion, list) else completion


def _extract(pattern, completions) -> list[str | None]:
    """The first group of `pattern` in each completion, None where it does not match."""
    return [m.group(1) if (m := pattern.search(_text(c))) is not None else None for c in completions]


def make_reward_functions(eos_token: str | None) -> list:
    """The four reward functions, in REWARD_NAMES order."""
    exact = match_format(eos_token)

    def match_format_exactly(completions, **kwargs):
        return [3.0 if exact.search(_text(c)) is not None else 0.0 for c in completions]

    def match_format_approximately(completions, **kwargs):
        scores = []
        for c in completions:
            text = _text(c)
            # REASONING_START is part of the prompt, so it is not rewarded; each other marker once.
            scores.append(sum(0.5 if text.count(m) == 1 else -1.0 for m in (REASONING_END, SOLUTION_START, SOLUTION_END)))
        return scores

    def check_answer(completions, answer, **kwargs):
        scores = []
        for guess, true_answer in zip(_extract(exact, completions), answer, strict=True):
            if guess is None:
                scores.append(-2.0)
            elif guess == true_answer:
                scores.append(5.0)
            elif guess.strip() == true_answer.strip():
                scores.append(3.5)
            else:
                try:
                    ratio = float(guess) / float(true_answer)
                except (ValueError, ZeroDivisionError):
                    scores.append(-4.5)
                    continue
                if 0.9 <= ratio <= 1.1:
                    scores.append(2.0)
                elif 0.8 <= ratio <= 1.2:
                    scores.append(1.5)
                else:
                    scores.append(-2.5)
        return scores

    def check_numbers(completions, answer, **kwargs):
        scores = []
        for guess, true_answer in zip(_extract(MATCH_NUMBERS, completions), answer, strict=True):
            if guess is None:
                scores.append(-2.5)
                continue
            try:
                scores.append(3.5 if float(guess.strip().replace(",", "")) == float(true_answer.strip()) else -1.5)
            except ValueError:
                scores.append(0.0)
        return scores

    functions = [match_format_exactly, match_format_approximately, check_answer, check_numbers]
    assert tuple(f.__name__ for f in functions) == REWARD_NAMES
    return functions
