import pytest

from grpo_equivalence.training.answer_format import REASONING_END, SOLUTION_END, SOLUTION_START
from grpo_equivalence.training.rewards import REWARD_NAMES, make_reward_functions

EOS = "<|endoftext|>"
exactly, approximately, check_answer, check_numbers = make_reward_functions(EOS)


def msg(text):
    return [{"role": "assistant", "content": text}]


GOOD = f"3+4=7{REASONING_END}{SOLUTION_START}7{SOLUTION_END}"
WRONG = f"3+4=8{REASONING_END}{SOLUTION_START}8{SOLUTION_END}"
NO_FORMAT = "the answer is 7"


def test_names_are_the_metric_names_trl_logs():
    assert tuple(f.__name__ for f in make_reward_functions(EOS)) == REWARD_NAMES


@pytest.mark.parametrize(
    "text, score",
    [
        (GOOD, 3.0),
        (GOOD + EOS, 3.0),  # EOS allowed at the end
        (GOOD + "  \n", 3.0),
        (GOOD + " trailing words", 0.0),  # nothing may follow the solution
        (f"{SOLUTION_START}7{SOLUTION_END}", 0.0),  # the working out must be closed first
        (NO_FORMAT, 0.0),
    ],
)
def test_match_format_exactly(text, score):
    assert exactly([msg(text)]) == [score]


def test_match_format_exactly_accepts_plain_string_completions():
    assert exactly([GOOD, NO_FORMAT]) == [3.0, 0.0]


@pytest.mark.parametrize(
    "text, score",
    [
        (GOOD, 1.5),  # each of the three markers once
        (NO_FORMAT, -3.0),
        (f"{REASONING_END}{REASONING_END}{SOLUTION_START}7{SOLUTION_END}", 0.0),  # a marker twice: -1 + 0.5 + 0.5
    ],
)
def test_match_format_approximately(text, score):
    assert approximately([msg(text)]) == [score]


@pytest.mark.parametrize(
    "guess, answer, score",
    [
        ("7", "7", 5.0),
        (" 7 ", "7", 3.5),  # right up to spaces
        ("105", "100", 2.0),  # within 10 %
        ("85", "100", 1.5),  # within 20 %
        ("50", "100", -2.5),
        ("seven", "7", -4.5),  # not a number
        ("3", "0", -4.5),  # ratio to zero
    ],
)
def test_check_answer(guess, answer, score):
    text = f"x{REASONING_END}{SOLUTION_START}{guess}{SOLUTION_END}"
    assert check_answer([msg(text)], answer=[answer]) == [score]


def test_check_answer_without_format():
    assert check_answer([msg(NO_FORMAT)], answer=["7"]) == [-2.0]


@pytest.mark.parametrize(
    "text, answer, score",
    [
        (GOOD, "7", 3.5),
        (WRONG, "7", -1.5),
        (f"{SOLUTION_START}1,234{SOLUTION_END}", "1234", 3.5),  # thousands separators
        (f"{SOLUTION_START} 7 {SOLUTION_END}", "7", 3.5),
        (NO_FORMAT, "7", -2.5),  # no solution marker
        (f"{SOLUTION_START}1.2.3{SOLUTION_END}", "7", 0.0),  # a number that does not parse
    ],
)
def test_check_numbers(text, answer, score):
    assert check_numbers([msg(text)], answer=[answer]) == [score]


def test_scores_are_per_completion_in_order():
    assert check_numbers([msg(GOOD), msg(WRONG), msg(NO_FORMAT)], answer=["7", "7", "7"]) == [3.5, -1.5, -2.5]
