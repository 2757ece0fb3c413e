"""train.translate: length batching, input order, stdin/stdout, and agreement with plain generate()."""

from __future__ import annotations

import io

import torch
from tiny_folder import save_tiny_folder

from train import translate

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
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(s + "\n" for s in SOURCES)))
    translate.main(
        [str(tmp_path), "--batch_size", "2", "--num_beams", "3", "--max_new_tokens", "5", "--no_progress"]
    )
    with torch.no_grad():
        one_by_one = [
            model.generate(**tokenizer([s], return_tensors="pt"), num_beams=3, max_new_tokens=5)[0]
            for s in SOURCES
        ]
    expected = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in one_by_one]
    assert len(set(expected)) > 1
    assert capsys.readouterr().out.split("\n") == [*expected, ""]
