"""What a run prepares (train/preparation.py): lines cut to the length limits are counted, evaluation splits stay
aligned with their hypotheses, and an M2 file of another test set is refused before training.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tiny_run import (
    corpus,
    train_run,
    write,
)

from ode_transformer.files import read_lines


@pytest.mark.both_cpus
def test_truncated_training_and_test_lines_are_counted(tmp_path, caplog):
    src, tgt = corpus(tmp_path / "data")
    write(Path(src), "the dog number one runs far away over the hills\n" + "a dog\n" * 11)
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train"):
        train_run(
            tmp_path / "out", "--train_file", f"{src},{tgt}", "--max_source_length", "6", "--max_steps", "1"
        )
    assert (
        "train split: 1 of 12 source line(s) longer than --max_source_length 6 tokens were truncated; "
        "raise --max_source_length to keep them whole"
    ) in caplog.text
    assert "target line(s)" not in caplog.text  # no target line is longer than 16 tokens


@pytest.mark.both_cpus
def test_test_file_keeps_blank_and_undecodable_lines_aligned_with_their_hypotheses(tmp_path):
    """An evaluation split keeps every line: test_hypotheses.txt has one line per test source line, in order."""
    src, tgt = corpus(tmp_path / "data")
    test_src = tmp_path / "test.src"
    test_src.write_bytes(b"the dog number 1 runs\n\nthe \xff dog\nthe dog number 3 runs\n")
    test_tgt = write(tmp_path / "test.tgt", "der Hund\nder\n\nder Hund 3\n")
    out = tmp_path / "out"
    train_run(out, "--train_file", f"{src},{tgt}", "--test_file", f"{test_src},{test_tgt}",
              "--do_predict", "true", "--num_beams", "1", "--max_target_length", "6")  # fmt: skip
    assert len(read_lines(out / "test_hypotheses.txt")) == 4


@pytest.mark.both_cpus
def test_gec_m2_file_of_another_test_set_is_refused_before_training(tmp_path):
    """The M2 scorer pairs the i-th hypothesis with the i-th M2 sentence; another count would shift them all."""
    src, tgt = corpus(tmp_path / "data", lines=4)
    m2 = write(tmp_path / "one.m2", "S the dog\nA -1 -1|||noop|||-NONE-|||REQUIRED|||-NONE-|||0\n\n")
    out = tmp_path / "out"
    (out / "checkpoint-100").mkdir(parents=True)  # an earlier run, which --overwrite_output_dir would delete
    with pytest.raises(ValueError, match="has 1 sentences but the test split has 4 rows"):
        train_run(out, "--task", "gec", "--train_file", f"{src},{tgt}", "--test_file", f"{src},{tgt}",
                  "--m2_file", str(m2), "--overwrite_output_dir", "true")  # fmt: skip
    assert [p.name for p in out.iterdir()] == ["checkpoint-100"]  # refused before anything was deleted
