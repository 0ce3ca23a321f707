"""The study's data set, loaded with `load_dataset` whatever its origin, in the shape GRPOTrainer expects."""

from .answer_format import SYSTEM_PROMPT, conversation


def load_problems(dataset: dict, *, system_prompt: str | None, tokenizer=None):
    """`prompt` (chat messages) and `answer` columns; other columns are dropped.

    `dataset` is the config's dataset section with `path` resolved (for the tiny study: "json" and its
    data file). Problems whose prompt exceeds `max_prompt_tokens` are dropped, as the original study did
    to keep long prompts from crowding out completions.
    """
    from datasets import load_dataset

    data = load_dataset(dataset["path"], dataset.get("name"), split=dataset.get("split", "train"),
                        data_files=dataset.get("data_files"))
    prompt_col, answer_col = dataset.get("prompt_column", "prompt"), dataset.get("answer_column", "solution")
    for column in (prompt_col, answer_col):
        if column not in data.column_names:
            raise KeyError(f"data set {dataset['path']} has no column {column!r} (columns: {data.column_names}); "
                           f"set dataset.prompt_column / dataset.answer_column in the config")
    system = system_prompt or SYSTEM_PROMPT
    data = data.map(lambda row: {"prompt": conversation(row[prompt_col], system), "answer": str(row[answer_col])},
                    remove_columns=data.column_names)
    limit = dataset.get("max_prompt_tokens")
    if limit and tokenizer is not None:
        data = data.filter(lambda row: len(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True,
                                                                          tokenize=True)) <= limit)
    return data
