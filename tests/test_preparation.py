"""What a run prepares (train/preparation.py): lines cut to the length limits are counted, evaluation splits stay
aligned with their hypotheses, and an M2 file of another test set is refused before training.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_run import (
    EVALUATE,
    TINY_RUN,
    corpus,
    train_run,
    write,
)

from ode_transformer.files import read_lines
from ode_transformer.train.file_readers import load_local_file


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


def test_streaming_warns_about_records_it_skips_as_the_whole_file_reader_does(tmp_path, caplog, monkeypatch):
    """A streamed JSONL file whose records mostly use other keys (2,970 of 3,000 `src`/`tgt`) is warned about
    as the whole-file reader warns: read ahead before training starts, and again at the end of every pass; a
    file longer than the read-ahead is warned about for the rows read ahead."""
    from ode_transformer.train import preparation

    path = tmp_path / "mixed.jsonl"
    records = [
        {"source": f"a {i}", "target": f"b {i}"} if i % 100 == 0 else {"src": "a", "tgt": "b"}
        for i in range(3000)
    ]
    write(path, "".join(json.dumps(record) + "\n" for record in records))
    expected = f"{path}: 2970 empty line(s) skipped (line numbers 2, 3, 4, 5, 6, ...); 30 of 3000 rows loaded"
    columns = SimpleNamespace(source_column="source", target_column="target")

    def warnings(action) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ode_transformer.train.file_readers"):
            action()
        return [record.getMessage() for record in caplog.records]

    assert warnings(lambda: load_local_file(str(path), "seq2seq")) == [expected]
    stream = None

    def start_stream():
        nonlocal stream
        stream = preparation.stream_local_file(str(path), "seq2seq", columns)

    assert warnings(start_stream) == [expected]  # read ahead, before training starts
    assert warnings(lambda: list(stream)) == [expected]  # and at the end of every pass
    assert [row["source"] for row in stream] == [f"a {i}" for i in range(0, 3000, 100)]
    monkeypatch.setattr(preparation, "STREAM_READ_AHEAD", 1000)  # a file longer than what is read ahead
    assert warnings(start_stream) == [
        f"{path} (its first 1000 rows, read ahead): 990 empty line(s) skipped (line numbers 2, 3, 4, 5, 6, ...); "
        "10 of 1000 rows loaded"
    ]


def _hub_style_folder(folder: Path, renamed: str) -> Path:
    """A dataset folder as the Hub lays one out (a JSONL file per split), the ``renamed`` split's source column
    called `src`."""
    folder.mkdir()
    for split in ("train", "validation", "test"):
        key = "src" if split == renamed else "source"
        rows = [{key: f"the dog number {i} runs", "target": f"der Hund Nummer {i} läuft"} for i in range(12)]
        write(folder / f"{split}.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    return folder


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("renamed", ["test", "train"])
def test_a_split_with_a_renamed_column_is_one_line_naming_split_file_and_columns(
    tmp_path, streaming, renamed
):
    """A split with a renamed column, read whole or streamed, is refused in one line naming the split, its
    file, its columns, the other splits' columns and the fix, not a DatasetGenerationError or a "Couldn't
    cast" that names no file, split or fix; nothing is written."""
    folder = _hub_style_folder(tmp_path / "data", renamed)
    message = (
        f"dataset '{folder}': the {renamed} split ({folder / f'{renamed}.jsonl'}) has the columns ['src', 'target'], "
        "where the other splits have ['source', 'target']; rename its columns to those"
    )
    flags = ["--hub_dataset", str(folder), "--source_lang", "source", "--target_lang", "target"]
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        train_run(tmp_path / "out", *flags, "--streaming", str(streaming).lower(), "--do_predict", "true")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["validation_file", "hub_folder"])
def test_without_a_test_split_the_split_scored_is_named_everywhere(tmp_path, caplog, source):
    """A Hub-style folder without a test split, or --validation_file without --test_file, scores the
    validation split with a warning saying so, and hub_metrics.json, test_results.json and the card name it
    "validation", never "test"."""
    if source == "validation_file":
        data = ",".join(corpus(tmp_path / "data"))
        flags = ["--train_file", data, "--validation_file", data]
    else:
        folder = _hub_style_folder(tmp_path / "data", renamed="none")
        (folder / "test.jsonl").unlink()
        flags = ["--hub_dataset", str(folder), "--source_lang", "source", "--target_lang", "target"]
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.preparation"):
        document = train_run(out, *flags, *EVALUATE[2:])
    assert (
        "the data has no test split: --do_predict scores the validation split instead, and reports it as such"
        in caplog.text
    )
    saved = json.loads((out / "hub_metrics.json").read_text(encoding="utf-8"))
    assert document["dataset"]["split"] == saved["dataset"]["split"] == "validation"
    assert json.loads((out / "test_results.json").read_text(encoding="utf-8"))["split"] == "validation"
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "      split: validation\n" in card and "validation: 12 examples scored." in card  # metadata, text
    assert "| validation | BLEU |" in card and "| test |" not in card and "split: test" not in card


def test_a_hub_dataset_the_hub_cannot_serve_is_said_in_words(tmp_path, monkeypatch, refused):
    """ode-train --hub_dataset offline (the Hub unreachable, no cached copy): one line naming the dataset, that
    the Hub cannot be reached, and the ways forward (local files, or a cache copied here with HF_HUB_OFFLINE=1),
    not datasets' "Couldn't reach ... (OfflineModeIsEnabled)", which quotes a mode the user never set."""
    import datasets.config
    import huggingface_hub.constants

    from ode_transformer import cli
    from ode_transformer.train.run import main

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(cli.HUB_UNREACHABLE_ENV, "1")  # what ode-train's check of the Hub sets beside it
    flags = ["--hub_dataset", "nobody/no-such-corpus", "--source_lang", "en", "--target_lang", "de"]
    error = refused(main, [*TINY_RUN, "--output_dir", str(tmp_path / "out"), *flags])
    assert (
        "the Hub dataset nobody/no-such-corpus could not be loaded: the Hugging Face Hub cannot be reached"
        in error
    )
    assert "--train_file" in error and "set HF_HUB_OFFLINE=1" in error
    assert "OfflineModeIsEnabled" not in error and "Couldn't reach" not in error
    assert len(error.strip().splitlines()) == 1, error
