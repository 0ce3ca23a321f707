"""The study's answer format: markers, system prompt, chat template, and the regexes that score it.

The format is Unsloth's GRPO recipe for Qwen3-4B-Base: working out between two markers, then the answer
between two more. The generation prompt already ends with the first marker, so completions start inside
the working out.
"""

import re

REASONING_START = "<start_working_out>"
REASONING_END = "<end_working_out>"
SOLUTION_START = "<SOLUTION>"
SOLUTION_END = "</SOLUTION>"
MARKERS = (REASONING_START, REASONING_END, SOLUTION_START, SOLUTION_END)

SYSTEM_PROMPT = (
    "You are given a problem.\n"
    "Think about the problem and provide your working out.\n"
    f"Place it between {REASONING_START} and {REASONING_END}.\n"
    f"Then, provide your solution between {SOLUTION_START}{SOLUTION_END}"
)

# System message, then user turns as plain text, assistant turns closed by EOS; the generation prompt
# opens the working out, so the model never has to emit REASONING_START itself.
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] + eos_token }}"
    "{% set loop_messages = messages[1:] %}"
    "{% else %}"
    "{% set loop_messages = messages %}"
    "{% endif %}"
    "{% for message in loop_messages %}"
    "{% if message['role'] == 'user' %}"
    "{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + REASONING_START + "' }}{% endif %}"
)


def conversation(problem: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict]:
    """The prompt of one problem, as the chat messages every backend receives."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": problem}]


def prompt_messages(prompt, system_prompt: str = SYSTEM_PROMPT) -> list[dict]:
    """A data set's prompt as chat messages: text becomes the user's turn after the system prompt; chat messages
    (TRL's conversational format) are kept, the system prompt put first only where they have none."""
    if isinstance(prompt, str):
        return conversation(prompt, system_prompt)
    if problem := message_problem(prompt):
        raise ValueError(problem)
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    return messages if messages[0]["role"] == "system" else [{"role": "system", "content": system_prompt}, *messages]


def message_problem(prompt) -> str | None:
    """Why `prompt` is neither text nor a list of chat messages ({"role": ..., "content": text}), or None."""
    if isinstance(prompt, str):
        return None
    if not isinstance(prompt, list) or not prompt:
        return f"a prompt is text or a list of chat messages, not {type(prompt).__name__} {str(prompt)[:60]!r}"
    for message in prompt:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(
                message.get("content"), str):
            return (f"a prompt's chat message is {{\"role\": ..., \"content\": text}}, not {str(message)[:80]!r}")
    return None


def target_completion(working: str, answer: str) -> str:
    """A completion in the exact format (what priming teaches the tiny model)."""
    return f"{working}{REASONING_END}{SOLUTION_START}{answer}{SOLUTION_END}"


def match_format(eos_token: str | None) -> re.Pattern:
    """Exact format: the end of the working out, then the solution, then nothing but spaces and EOS."""
    eos = f"(?:{re.escape(eos_token)})?" if eos_token else ""
    return re.compile(
        rf"{REASONING_END}.*?{SOLUTION_START}(.+?){SOLUTION_END}[\s]{{0,}}{eos}[\s]{{0,}}$",
        flags=re.MULTILINE | re.DOTALL,
    )


MATCH_NUMBERS = re.compile(SOLUTION_START + r".*?[\s]{0,}([-]?[\d\.\,]{1,})", flags=re.MULTILINE | re.DOTALL)
