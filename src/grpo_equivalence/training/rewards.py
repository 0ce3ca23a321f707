"""The study's four reward functions, with Unsloth's scoring, and the reward functions a study names.

TRL names each reward metric after the function's `__name__` (`rewards/<name>/mean`), so the functions
keep the study's names. They depend on the tokenizer's EOS token (the exact-format regex allows it at
the end), hence the factory.
"""

from pathlib import Path

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


# --- The reward functions a study names (config `rewards`), as TRL's reward_funcs -----------------------------

STUDY_SET = "study"  # the original study's four, above (make_reward_functions)


class RewardSpecError(ValueError):
    pass


def _parts(spec: str) -> tuple[str, str]:
    target, _, function = spec.rpartition(":")
    if not target or not function.isidentifier():
        raise RewardSpecError(f"{spec!r} is not MODULE:FUNCTION or FILE.py:FUNCTION (or {STUDY_SET!r}, the study's four)")
    return target, function


def resolved(specs: list[str], bases=()) -> list[str]:
    """The specs with every FILE.py made absolute: as given if absolute, else beside the first of `bases` (the
    study file's folder, the working directory) that holds it."""
    out = []
    for spec in specs:
        if spec == STUDY_SET:
            out.append(spec)
            continue
        target, function = _parts(spec)
        if target.endswith(".py"):
            path = Path(target).expanduser()
            if not path.is_absolute():
                path = next((Path(b) / path for b in bases if (Path(b) / path).is_file()), path)
            target = str(path.resolve())
        out.append(f"{target}:{function}")
    return out


def _import(spec: str, written: str | None = None):
    """The function `spec` names; errors name it as the study wrote it (`written`)."""
    import importlib
    import importlib.util

    target, function = _parts(spec)
    said = written or spec
    shown = _parts(said)[0] if said != spec else target
    if target.endswith(".py"):
        if not Path(target).is_file():
            raise RewardSpecError(f"{said!r}: {shown} does not exist; give the file's path (relative to the study file "
                                  f"or the working directory)")
        name = f"grpo_equivalence_user_rewards_{abs(hash(target))}"
        import sys

        folder = str(Path(target).resolve().parent)
        if folder not in sys.path:  # the modules beside it import as it expects (their changes rerun: reward_code)
            sys.path.append(folder)
        module_spec = importlib.util.spec_from_file_location(name, target)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise RewardSpecError(f"{said!r}: module {target} cannot be imported ({error}); install it, or give a "
                                  f"file: path/to/rewards.py:{function}") from None
    if not hasattr(module, function):
        raise RewardSpecError(f"{said!r}: {shown} has no {function!r}")
    return getattr(module, function)


def _signature_problem(spec: str, function) -> str | None:
    import inspect

    if not callable(function):
        return f"{spec!r} is a {type(function).__name__}, not a function"
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        return (f"{spec!r} must take **kwargs: TRL calls it with prompts, completions, completion_ids and the data "
                f"set's columns (answer) by name; write def {getattr(function, '__name__', 'f')}(completions, **kwargs)")
    return None


# What TRL's GRPOTrainer passes every reward function besides the data set's columns (_calculate_rewards, TRL 1.15 and
# 1.16); the columns named prompt, completion and completion_ids are not passed as such
TRL_REWARD_ARGUMENTS = frozenset(("prompts", "completions", "completion_ids", "trainer_state", "log_extra",
                                  "log_metric", "environments"))
NOT_PASSED_COLUMNS = frozenset(("prompt", "completion", "completion_ids"))


def _required_arguments(function) -> list[str]:
    """The keyword arguments `function` cannot do without (no default; not *args or **kwargs)."""
    import inspect

    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def missing_columns(functions, columns) -> list[str]:
    """One line per reward function that takes a column the data set lacks, naming both and the fix: TRL would fail
    at the first step with a TypeError."""
    available = TRL_REWARD_ARGUMENTS | (set(columns) - NOT_PASSED_COLUMNS)
    found = []
    for function in functions:
        missing = [name for name in _required_arguments(function) if name not in available]
        if missing:
            found.append(f"reward {getattr(function, '__name__', function)!r} takes {', '.join(map(repr, missing))}, "
                         f"a column the data set does not have (its columns: {', '.join(sorted(columns))}); add it to "
                         f"the data, or point dataset.answer_column at the column that holds the answer (it is passed "
                         f"as 'answer')")
    return found


def load(specs: list[str], eos_token: str | None) -> list:
    """The reward functions of `specs` (resolved), in order: the study's set expands to its four; a study's own
    each named in its errors (named)."""
    functions = []
    for spec in specs:
        functions += make_reward_functions(eos_token) if spec == STUDY_SET else [named(_import(spec), spec)]
    return functions


class RewardError(RuntimeError):
    """A study's reward function failed or returned what TRL cannot use: the message names it."""


def named(function, spec: str):
    """`function` as TRL calls it, its errors naming it and its file (`spec`): an exception it raises, and a result
    that is not one number (or None) per completion, which TRL would turn into "too many dimensions 'str'"."""
    import functools
    import numbers

    @functools.wraps(function)
    def reward(*args, **kwargs):
        try:
            values = function(*args, **kwargs)
        except Exception as error:
            raise RewardError(f"reward {spec} raised {type(error).__name__}: {error}; fix that function") from error
        completions = kwargs.get("completions", args[1] if len(args) > 1 else None)
        bad = None if isinstance(values, (list, tuple)) else type(values).__name__
        if bad is None:
            bad = next((repr(v)[:40] for v in values if v is not None and (
                isinstance(v, bool) or not isinstance(v, numbers.Real))), None)
        if bad is not None:
            raise RewardError(f"reward {spec} returned {bad}, not a number (or None) per completion; return a list of "
                              f"floats")
        if completions is not None and len(values) != len(completions):
            raise RewardError(f"reward {spec} returned {len(values)} values for {len(completions)} completions; return "
                              f"one per completion")
        return values

    return reward


def problems(specs: list[str], reward_weights=None, written: list[str] | None = None, columns=None) -> list[str]:
    """Every spec (resolved) imported and checked (a function taking **kwargs, names unique, weights one per
    function, and where the data set's `columns` are known, no argument the data set has no column for), one line
    each, naming the key as the study wrote it (`written`) and the fix."""
    found, names, loaded = [], [], []
    for i, spec in enumerate(specs):
        said = (written or specs)[i]
        try:
            functions = make_reward_functions(None) if spec == STUDY_SET else [_import(spec, said)]
        except RewardSpecError as error:
            found.append(f"rewards[{i}]: {error}")
            continue
        except Exception as error:  # the user's module failed while it was imported
            found.append(f"rewards[{i}]: importing {said!r} failed ({type(error).__name__}: {error}); fix that module")
            continue
        for function in functions:
            if (problem := _signature_problem(said, function)) is not None:
                found.append(f"rewards[{i}]: {problem}")
            names.append(getattr(function, "__name__", spec))
            loaded.append((i, function))
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        found.append(f"rewards: {', '.join(twice)} named twice; TRL logs each function as rewards/<its name>/mean, so "
                     f"give each a name of its own")
    if columns is not None:
        found += [f"rewards[{i}]: {line}" for i, function in loaded for line in missing_columns([function], columns)]
    if isinstance(reward_weights, list) and not found and len(reward_weights) != len(names):
        found.append(f"grpo.reward_weights: {len(reward_weights)} weight(s) for {len(names)} reward function(s) "
                     f"({', '.join(names)}); give one weight per function")
    return found
