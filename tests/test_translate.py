"""ode_transformer.train.translate: length batching, input order, stdin/stdout, and agreement with plain generate()."""

from __future__ import annotations

import io
import logging

import pytest
import torch
from tiny_folder import save_tiny_folder

from ode_transformer.train import translate

SOURCES = [
    "the dog",
    "a cat sleeps on the warm mat in the park",
    "zwei Hunde",
    "",
    "the dog runs in the park",
]


def test_length_batches_longest_first():
    lengths = [3, 1, 3, 2, 5]
    assert translate.length_batches(lengths, 2) == [[4, 0], [2, 3], [1]]
    assert translate.length_batches([], 4) == []


def test_stdin_to_stdout_in_input_order(tmp_path, monkeypatch, capsys):
    model, tokenizer = save_tiny_folder(tmp_path, weight_scale=3)
    stdin = "".join(s + "\n" for s in SOURCES).encode("utf-8")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    translate.main(
        [str(tmp_path), "--batch_size", "2", "--num_beams", "3", "--max_new_tokens", "5", "--no_progress"]
    )
    with torch.no_grad():
        one_by_one = [
            model.generate(**tokenizer([s], return_tensors="pt"), num_beams=3, max_new_tokens=5)[0]
            for s in SOURCES
        ]
    expected = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in one_by_one]
    expected[SOURCES.index("")] = ""  # an empty input line gets an empty output line (#65 row 7)
    assert len(set(expected)) > 1
    assert capsys.readouterr().out.split("\n") == [*expected, ""]


def test_an_overlong_lm_prompt_keeps_its_end_and_leaves_room_for_the_continuation(tmp_path, caplog):
    """A causal LM continues the end of its prompt: an overlong prompt is cut at its start (after `<s>`), whatever
    the tokenizer's own truncation side, to the model's 128 positions less the new tokens, and generates what the
    model generates from exactly those ids; without max_new_tokens anywhere, transformers' default of 20 new tokens.
    128 is the trained length, not a limit: 127 new tokens leave the prompt <s> and its last token. max_new_tokens 0
    would generate nothing: refused."""
    model, tokenizer = save_tiny_folder(tmp_path, causal=True, weight_scale=3)
    tokenizer.truncation_side = "right"
    prompt = " ".join(f"w{i % 7} dog{i % 5}" for i in range(150))
    full = tokenizer(prompt)["input_ids"]
    assert full[0] == tokenizer.bos_token_id and len(full) > 128
    assert model.generation_config.max_new_tokens is None and model.generation_config.max_length is None
    for new_tokens in (8, None, 127):
        kept = [tokenizer.bos_token_id, *full[-max(128 - (new_tokens or 20) - 1, 1) :]]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ode_transformer.train.translate"):
            (text,) = translate.generate_texts(
                model, tokenizer, [prompt], max_new_tokens=new_tokens, num_beams=1
            )
        assert f"1 input line(s) longer than {len(kept)} tokens were truncated (the model's " \
               f"max_position_embeddings 128 less max_new_tokens {new_tokens or 20})" in caplog.text  # fmt: skip
        with torch.no_grad():
            expected = model.generate(
                torch.tensor([kept]), max_new_tokens=new_tokens or 20, num_beams=1, do_sample=False
            )
        assert text == tokenizer.decode(expected[0, len(kept) :], skip_special_tokens=True).strip() != ""
    assert tokenizer.truncation_side == "right"  # restored
    with pytest.raises(ValueError, match="^max_new_tokens 0: give a positive number"):
        translate.generate_texts(model, tokenizer, [prompt], max_new_tokens=0)


def test_api_input_mistakes_are_named(tmp_path):
    """generate_texts as a user calls it: a single string (which list() would split into characters), a
    non-string item, several returns per input (which would be matched to the wrong inputs), a batch size or
    source length of 0 (silently one batch, or the default) or no new tokens. More new tokens than the model's
    trained length (128) are no mistake: its positions have no limit. An empty generator gives no outputs, like an
    empty list."""
    model, tokenizer = save_tiny_folder(tmp_path, weight_scale=3)
    cases = [
        (TypeError, "texts is one string", "the dog", {}),
        (TypeError, r"texts\[1\] is NoneType, not a string", ["the dog", None], {}),
        (ValueError, "num_return_sequences 2: this returns one output per input", SOURCES,
         {"num_beams": 2, "num_return_sequences": 2}),
        (ValueError, "batch_size 0: give a positive number", SOURCES, {"batch_size": 0}),
        (ValueError, "max_source_length 0: give a positive number", SOURCES, {"max_source_length": 0}),
        (ValueError, "max_new_tokens 0: give a positive number", SOURCES, {"max_new_tokens": 0}),
    ]  # fmt: skip
    for error, message, texts, kwargs in cases:
        with pytest.raises(error, match=message):
            translate.generate_texts(model, tokenizer, texts, **kwargs)
    assert translate.generate_texts(model, tokenizer, (text for text in [])) == []
    generated = translate.generate_texts(model, tokenizer, (text for text in SOURCES[:2]), max_new_tokens=140)
    assert generated == translate.generate_texts(model, tokenizer, SOURCES[:2], max_new_tokens=140)
    if not torch.cuda.is_available():  # named, not torch's "Torch not compiled with CUDA enabled"
        with pytest.raises(ValueError, match="device cuda: this torch has no CUDA device"):
            translate.load_for_generation(str(tmp_path), device="cuda")


def test_a_byte_order_mark_is_not_part_of_the_first_input(tmp_path, capsys):
    """Windows editors start UTF-8 files with a byte-order mark; it had been tokenized into the first line."""
    save_tiny_folder(tmp_path / "model", weight_scale=3)
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text("the dog runs\nzwei Hunde\n", encoding="utf-8")
    marked.write_text("the dog runs\nzwei Hunde\n", encoding="utf-8-sig")
    assert marked.read_bytes().startswith(b"\xef\xbb\xbf")
    outputs = []
    for source in (plain, marked):
        translate.main([str(tmp_path / "model"), "--input", str(source), "--num_beams", "1", "--no_progress"])
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 2
