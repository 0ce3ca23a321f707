import torch

from grpo_equivalence.training import tiny
from grpo_equivalence.training.answer_format import MARKERS, conversation, target_completion


def test_markers_are_single_tokens_kept_by_skip_special_tokens():
    tokenizer = tiny.build_tokenizer()
    text = target_completion("3+4=7", "7")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    for marker in MARKERS[1:]:
        assert len(tokenizer(marker, add_special_tokens=False)["input_ids"]) == 1
    assert len(ids) == len("3+4=7") + 3 + 1  # characters, three markers, the answer digit
    assert tokenizer.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=True) == text


def test_chat_template_ends_the_prompt_inside_the_working_out():
    tokenizer = tiny.build_tokenizer()
    prompt = tokenizer.apply_chat_template(conversation("3+4", "Sys."), add_generation_prompt=True, tokenize=False)
    assert prompt == f"Sys.{tiny.EOS}3+4{MARKERS[0]}"


def test_model_and_tokenizer_load_back_with_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny.save_model(tmp_path, hidden_size=32, num_layers=1, seed=0)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert model.config.model_type == "qwen3"
    assert tokenizer("a<SOLUTION>")["input_ids"] == tiny.build_tokenizer()("a<SOLUTION>")["input_ids"]


def test_the_model_is_deterministic():
    tokenizer = tiny.build_tokenizer()
    a = tiny.build_model(tokenizer, hidden_size=32, num_layers=1, seed=0)
    b = tiny.build_model(tokenizer, hidden_size=32, num_layers=1, seed=0)
    c = tiny.build_model(tokenizer, hidden_size=32, num_layers=1, seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_problems_are_seeded_and_correct():
    rows = tiny.problems(50, 9, seed=1)
    assert rows == tiny.problems(50, 9, seed=1) and rows != tiny.problems(50, 9, seed=2)
    for row in rows:
        a, b = map(int, row["prompt"].split("+"))
        assert row["solution"] == str(a + b) and row["working"] == f"{a}+{b}={a + b}"


def test_embedding_is_padded_like_a_real_checkpoints(tmp_path):
    """vLLM (through Unsloth) needs an embedding of a multiple of 128 rows; the tokenizer stays smaller."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny.save_model(tmp_path, hidden_size=32, num_layers=1, seed=0)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    rows = model.get_input_embeddings().weight.shape[0]
    assert rows % 128 == 0 and len(tokenizer) < rows == model.config.vocab_size
    assert tiny.padded_vocab_size(128) == 128 and tiny.padded_vocab_size(129) == 256
    # ids past the tokenizer decode to nothing rather than failing
    assert tokenizer.decode([rows - 1, tokenizer.convert_tokens_to_ids("7")]) == "7"


def test_the_output_layer_is_never_square_whatever_the_width(tmp_path):
    """At vocabulary = hidden size Unsloth's GRPO loss takes the model's hidden states for logits (measured on the
    H200: docs/examples/h200-non-square-head); the study's own width, 128, is the size the tokenizer rounds up to."""
    from transformers import AutoModelForCausalLM

    assert tiny.padded_vocab_size(103, 128) == 256 and tiny.padded_vocab_size(103, 256) == 128
    tiny.save_model(tmp_path, hidden_size=128, num_layers=1, seed=0)
    head = AutoModelForCausalLM.from_pretrained(tmp_path).get_output_embeddings().weight
    assert tuple(head.shape) == (256, 128)
