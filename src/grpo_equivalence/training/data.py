"""The study's data set, loaded with `load_dataset` whatever its origin, in the shape GRPOTrainer expects."""

from .answer_format import SYSTEM_PROMPT, prompt_messages

ANSWER = "answer"  # the answer column, as text, under the name the study's rewards take it by


def load_problems(dataset: dict, *, system_prompt: str | None, tokenizer=None):
    """Every column of the data set, as TRL passes them all to the reward functions, with `prompt` as chat messages
    and, where the data set has the answer column, `answer` as its text.

    `dataset` is the config's dataset section with `path` resolved (for the tiny study: "json" and its
    data file). A prompt is text (the user's turn, after the system prompt) or chat messages (TRL's conversational
    format: the system prompt is put first where they have none). Problems whose prompt exceeds
    `max_prompt_tokens` are dropped, as the original study did to keep long prompts from crowding out completions.
    """
    from datasets import load_dataset

    data = load_dataset(dataset["path"], dataset.get("name"), split=dataset.get("split", "train"),
                        data_files=dataset.get("data_files"))
    prompt_col, answer_col = dataset.get("prompt_column", "prompt"), dataset.get("answer_column", "solution")
    if prompt_col not in data.column_names:
        raise KeyError(f"data set {dataset['path']} has no column {prompt_col!r} (columns: {data.column_names}); "
                       f"set dataset.prompt_column in the config")
    system = system_prompt or SYSTEM_PROMPT
    with_answer = answer_col in data.column_names

    def shape(row):
        shaped = {"prompt": prompt_messages(row[prompt_col], system)}
        if with_answer:
            shaped[ANSWER] = str(row[answer_col])
        return shaped

    data = data.map(shape)
    limit = dataset.get("max_prompt_tokens")
    if limit and tokenizer is not None:
        # return_dict=False: transformers 5 returns a dict (of two keys) by default, whose length is no prompt's
        data = data.filter(lambda row: len(tokenizer.apply_chat_template(
            row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)) <= limit)
    return data


def columns_after_loading(columns, dataset: dict) -> set[str]:
    """The columns load_problems gives a data set that has `columns`: the reward functions get each of them."""
    found = set(columns) | {"prompt"}
    if dataset.get("answer_column", "solution") in found:
        found.add(ANSWER)
    return found
