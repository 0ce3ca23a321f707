"""Reward functions of the example study, as TRL calls them: the completions (each a list of chat messages, for
a conversational data set) and the data set's columns by name; one float per completion."""

import re

ANSWER = re.compile(r"<answer>\s*(-?[\d.,]+)\s*</answer>")


def _text(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


def correct_answer(completions, answer, **kwargs):
    """2 for the right number between <answer> and </answer>, 0 for a wrong one, -1 without the tags."""
    scores = []
    for completion, truth in zip(completions, answer, strict=True):
        found = ANSWER.search(_text(completion))
        scores.append(-1.0 if found is None else 2.0 if found.group(1).replace(",", "") == truth else 0.0)
    return scores


def brief(completions, **kwargs):
    """Up to 0.5 for an answer given early: long working out costs a little."""
    return [max(0.0, 0.5 - len(_text(c)) / 4000) for c in completions]
