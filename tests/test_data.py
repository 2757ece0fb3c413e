"""Tests of the loaders (ode_transformer.train.file_readers, ode_transformer.train.hub_datasets), of
ode_transformer.train.data (shared-corpus readers, data specs), of word dropout and of
ode_transformer.train.libreoffice_corpus (HTML pairing, cleaning, module split, corpus build)."""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict, IterableDataset

from ode_transformer.train import data
from ode_transformer.train import libreoffice_corpus as lo
from ode_transformer.train.data import (
    DataSpec,
    cnndm,
    conll2013_test,
    fce,
    jfleg_dev,
    load_task_data,
    multi30k,
    ptb,
    wi_locness,
    wmt_test,
)
from ode_transformer.train.file_readers import (
    iter_local_rows,
    load_jsonl,
    load_local_file,
    load_parallel_files,
    load_tsv,
)
from ode_transformer.train.hub_datasets import load_hub_dataset


def _gz_lines(path: Path) -> list[str]:
    """Independent reader: like ``zcat path``, one string per line."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def _write_gz(path: Path, data: bytes) -> Path:
    with gzip.open(path, "wb") as f:
        f.write(data)
    return path


# --------------------------------------------------------------------------------------------
# load_parallel_files


def test_parallel_files_gz_and_plain(tmp_path, caplog):
    src = _write_gz(tmp_path / "a.en.gz", b"one\ntwo\nthree\n")
    tgt = tmp_path / "a.de"
    tgt.write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.file_readers"):
        ds = load_parallel_files(src, tgt)
    assert isinstance(ds, Dataset)
    assert ds.column_names == ["source", "target"]
    assert ds["source"] == ["one", "two", "three"] and ds["target"] == ["eins", "zwei", "drei"]
    assert not caplog.records  # all 3 lines read, all 3 kept: nothing to report


def test_parallel_files_misaligned_names_files_and_counts(tmp_path):
    src, tgt = tmp_path / "x.src", tmp_path / "x.tgt"
    src.write_text("a\nb\nc\n")
    tgt.write_text("a\nb\n")
    with pytest.raises(ValueError) as err:
        load_parallel_files(src, tgt)
    message = str(err.value)
    assert f"{src}: 3 lines" in message and f"{tgt}: 2 lines" in message


def test_parallel_files_skip_and_report_bad_lines(tmp_path, caplog):
    src = tmp_path / "s"
    tgt = tmp_path / "t"
    src.write_bytes(b"s1\ns2\n\xff\xfe bad\ns4\n   \ns6\n")
    tgt.write_bytes(b"t1\n\nt3\nt4\nt5\nt6\r\n")
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.file_readers"):
        ds = load_parallel_files(src, tgt)
    # no shift: every kept source line is still paired with the target of the same line
    assert list(zip(ds["source"], ds["target"])) == [("s1", "t1"), ("s4", "t4"), ("s6", "t6")]
    assert (
        f"{src} / {tgt}: 1 undecodable (non-UTF-8) line(s) skipped (line numbers 3); 3 of 6 rows loaded"
        in caplog.text
    )
    assert f"{src} / {tgt}: 2 empty line(s) skipped (line numbers 2, 5); 3 of 6 rows loaded" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.file_readers"):
        kept = load_parallel_files(src, tgt, skip_empty=False)
    # an evaluation set keeps every line, so hypotheses stay aligned with inputs and references
    assert kept.num_rows == 6 and kept["target"][1] == "" and kept["source"][2] == "\ufffd\ufffd bad"
    assert (
        "1 undecodable (non-UTF-8) line(s) kept as U+FFFD (line numbers 3); 6 of 6 rows loaded" in caplog.text
    )
    assert "2 empty line(s) kept (line numbers 2, 5); 6 of 6 rows loaded" in caplog.text


@pytest.mark.parametrize("suffix", ["pair", ".tsv", ".jsonl"])
def test_local_evaluation_split_keeps_every_row(tmp_path, suffix):
    """A --validation_file / --test_file keeps blank rows (a missing value as ""): one hypothesis per input."""
    rows = [("a b", "x y"), ("", "z"), ("c", ""), ("d", "w")]
    if suffix == "pair":
        write_lines(tmp_path / "s", [source for source, _ in rows])
        write_lines(tmp_path / "t", [target for _, target in rows])
        spec = f"{tmp_path / 's'},{tmp_path / 't'}"
    elif suffix == ".tsv":
        spec = write_lines(tmp_path / "d.tsv", ["source\ttarget", *(f"{s}\t{t}" for s, t in rows)])
    else:
        spec = write_lines(
            tmp_path / "d.jsonl", [json.dumps({"source": s, "target": t or None}) for s, t in rows]
        )
    kept = load_local_file(str(spec), "seq2seq", skip_empty=False)
    assert list(zip(kept["source"], kept["target"])) == rows
    assert load_local_file(str(spec), "seq2seq").num_rows == 2  # training drops them


# --------------------------------------------------------------------------------------------
# TSV / JSONL / Hub-style folders


def test_load_tsv(tmp_path):
    path = _write_gz(tmp_path / "d.tsv.gz", b'de\ten\tnote\nHallo "du"\tHello "you"\tx\nNA\tnull\t\n')
    ds = load_tsv(path, "en", "de")
    assert ds.column_names == ["source", "target"]
    assert ds["source"] == ['Hello "you"', "null"] and ds["target"] == ['Hallo "du"', "NA"]
    with pytest.raises(ValueError) as err:
        load_tsv(path, "fr", "de")
    assert (
        "'fr'" in str(err.value) and str(path) in str(err.value) and "['de', 'en', 'note']" in str(err.value)
    )


def test_tsv_and_jsonl_rows_without_target_are_skipped_and_reported(tmp_path, caplog):
    tsv = tmp_path / "d.tsv"
    tsv.write_text("source\ttarget\na b\tc d\nno target here\n\te f\ng h\ti j\n", encoding="utf-8")
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text(
        '{"source": "a", "target": "b"}\n{"source": "x"}\n{"source": "y", "target": "  "}\n', encoding="utf-8"
    )
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.file_readers"):
        from_tsv = load_tsv(tsv, "source", "target")
        from_jsonl = load_jsonl(jsonl, "source", "target")
    assert list(zip(from_tsv["source"], from_tsv["target"])) == [("a b", "c d"), ("g h", "i j")]
    assert list(zip(from_jsonl["source"], from_jsonl["target"])) == [("a", "b")]
    # file line numbers: the TSV header is line 1
    assert f"{tsv}: 2 empty line(s) skipped (line numbers 3, 4); 2 of 4 rows loaded" in caplog.text
    assert f"{jsonl}: 2 empty line(s) skipped (line numbers 2, 3); 1 of 3 rows loaded" in caplog.text


def test_language_model_training_file_drops_blank_lines(tmp_path, caplog):
    """A blank line of a language model's training file is skipped with a warning, not made a training example
    of <s> alone; an evaluation file keeps it (its perplexity is over every line)."""
    path = write_lines(tmp_path / "lm.txt", ["the dog runs", "", "  ", "a cat sleeps"])
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.file_readers"):
        assert load_local_file(str(path), "lm")["text"] == ["the dog runs", "a cat sleeps"]
    assert f"{path}: 2 empty line(s) skipped (line numbers 2, 3); 2 of 4 rows loaded" in caplog.text
    assert load_local_file(str(path), "lm", skip_empty=False)["text"] == [
        "the dog runs",
        "",
        "",
        "a cat sleeps",
    ]


def test_utf16_and_carriage_return_files_are_refused(tmp_path):
    """A UTF-16 file is refused rather than read as rows of NUL-interleaved bytes (plus a stray row), and so is a file
    whose lines end in a bare carriage return, rather than read as one pair holding the whole file."""
    lines = ["the dog", "a cat", "two birds"]
    (tmp_path / "u16.src").write_bytes("\n".join(lines).encode("utf-16"))
    (tmp_path / "cr.src").write_bytes("\r".join(lines).encode() + b"\r")
    write_lines(tmp_path / "ok.tgt", lines)
    with pytest.raises(ValueError, match=r"u16.src looks like UTF-16 text .* iconv -f utf-16 -t utf-8"):
        load_parallel_files(tmp_path / "u16.src", tmp_path / "ok.tgt")
    (tmp_path / "u16.src").write_bytes("\n".join(lines).encode("utf-16-le"))  # no byte-order mark
    with pytest.raises(ValueError, match=r"u16.src looks like UTF-16 text"):
        load_parallel_files(tmp_path / "u16.src", tmp_path / "ok.tgt")
    (tmp_path / "nul.src").write_bytes(b"the\x00dog\na cat\ntwo birds\n")  # one stray NUL is UTF-8 text
    assert load_parallel_files(tmp_path / "nul.src", tmp_path / "ok.tgt")["source"][0] == "the\x00dog"
    with pytest.raises(ValueError, match=r"cr.src ends its lines with a bare carriage return"):
        load_parallel_files(tmp_path / "cr.src", tmp_path / "ok.tgt")


def test_tsv_rows_are_read_as_written(tmp_path, caplog):
    """Every TSV line below the header is one row of text: a row with a field more than the header is refused by
    line (pandas makes the first column an index when every row has one, shifting source and target), a blank
    line of an evaluation split is kept (one hypothesis per line), numerals stay text, and a file replaced by
    another with the same modification time is read again (no cache keyed on path and mtime)."""
    path = write_lines(tmp_path / "d.tsv", ["source\ttarget", "the dog\tder Hund\textra", "a\tb"])
    with pytest.raises(ValueError, match=r"d.tsv, line 2: 3 tab-separated fields, but the header has 2"):
        load_tsv(path, "source", "target")
    path = write_lines(tmp_path / "d.tsv", ["source\ttarget", "one\t001", "", "two\t002"])
    kept = load_tsv(path, "source", "target", skip_empty=False)
    assert list(zip(kept["source"], kept["target"])) == [("one", "001"), ("", ""), ("two", "002")]
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.file_readers"):
        assert load_tsv(path, "source", "target")["target"] == ["001", "002"]
    assert f"{path}: 1 empty line(s) skipped (line numbers 3); 2 of 3 rows loaded" in caplog.text
    stamp = path.stat().st_mtime_ns
    write_lines(path, ["source\ttarget", "three\t003"])
    os.utime(path, ns=(stamp, stamp))
    assert load_tsv(path, "source", "target")["source"] == ["three"]


def test_jsonl_records_that_lack_a_nested_field_are_skipped(tmp_path, caplog):
    """The Hub's {"translation": {"en": ..., "de": ...}} records: one without the language, with a null
    translation or without the key is a missing value (skipped and reported), not a KeyError; a line that is not
    UTF-8 is named with its line."""
    records = [{"translation": {"en": "Yes", "de": "Ja"}}, {"translation": {"en": "No"}}, {"translation": None},
               {"id": 4}, {"translation": {"en": "Hi", "de": "Hallo"}}]  # fmt: skip
    path = write_lines(tmp_path / "d.jsonl", [json.dumps(record) for record in records])
    with caplog.at_level(logging.WARNING, logger="ode_transformer.train.file_readers"):
        pairs = load_jsonl(path, "translation.en", "translation.de")
    assert list(zip(pairs["source"], pairs["target"])) == [("Yes", "Ja"), ("Hi", "Hallo")]
    assert f"{path}: 3 empty line(s) skipped (line numbers 2, 3, 4); 2 of 5 rows loaded" in caplog.text
    path.write_bytes(b'{"source": "a", "target": "b"}\n{"source": "caf\xe9", "target": "c"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl, line 2: not UTF-8 text"):
        load_jsonl(path, "source", "target")


def test_misspelt_nested_field_and_json_array(tmp_path):
    """A nested field no record has (translation.fr) is an error naming the fields there are, not a pass of the
    check on 'translation' that scores an evaluation split against empty references. A .json file holding one
    array of objects (datasets' json builder reads it) loads as its objects."""
    records = [{"translation": {"en": "Yes", "de": "Ja"}}, {"translation": {"en": "No", "de": "Nein"}}]
    path = write_lines(tmp_path / "d.jsonl", [json.dumps(record) for record in records])
    with pytest.raises(
        ValueError, match=r"column 'translation.fr' not found .* \['translation', 'translation.en'"
    ):
        load_jsonl(path, "translation.en", "translation.fr", skip_empty=False)
    array = tmp_path / "d.json"
    array.write_text(json.dumps(records, indent=2), encoding="utf-8")
    pairs = load_jsonl(array, "translation.en", "translation.de")
    assert list(zip(pairs["source"], pairs["target"])) == [("Yes", "Ja"), ("No", "Nein")]
    tsv = write_lines(tmp_path / "d.tsv", ["translation\tx", "a\tb"])
    with pytest.raises(ValueError, match=r"column 'translation.en' not found .* \['translation', 'x'\]"):
        load_tsv(tsv, "translation.en", "x")


def test_load_jsonl_with_nested_field(tmp_path):
    rows = [
        {"translation": {"de": "Ja", "en": "Yes"}, "id": 1},
        {"translation": {"de": "Nein", "en": "No"}, "id": 2},
    ]
    path = _write_gz(tmp_path / "d.jsonl.gz", "".join(json.dumps(r) + "\n" for r in rows).encode())
    ds = load_jsonl(path, "translation.de", "translation.en")
    assert ds["source"] == ["Ja", "Nein"] and ds["target"] == ["Yes", "No"]
    with pytest.raises(ValueError) as err:
        load_jsonl(path, "src", "translation.en")
    assert (
        "'src'" in str(err.value)
        and str(path) in str(err.value)
        and "['translation', 'translation.de', 'translation.en', 'id']" in str(err.value)
        and "choose with --source_column/--target_column; a.b reads key b of field a" in str(err.value)
    )


def _hub_folder(root: Path, splits: dict[str, dict[str, list]]) -> Path:
    """A local dataset repo laid out like the Hub's parquet conversion (data/<split>-*.parquet)."""
    (root / "data").mkdir(parents=True)
    for split, columns in splits.items():
        Dataset.from_dict(columns).to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    return root


@pytest.fixture
def wmt_like(tmp_path) -> Path:
    pairs = [{"de": f"Satz {i}", "en": f"sentence {i}"} for i in range(10)]
    return _hub_folder(
        tmp_path / "wmt14", {"train": {"translation": pairs[:8]}, "validation": {"translation": pairs[8:]}}
    )


def test_hub_translation_column(wmt_like, tmp_path):
    dd = load_hub_dataset(str(wmt_like), None, "de", "en")
    assert isinstance(dd, DatasetDict) and sorted(dd) == ["train", "validation"]
    assert dd["train"].column_names == ["source", "target"]
    assert dd["validation"][1] == {"source": "Satz 9", "target": "sentence 9"}
    reverse = load_hub_dataset(str(wmt_like), None, "en", "de", split="train")
    assert reverse[0] == {"source": "sentence 0", "target": "Satz 0"}


def test_hub_evaluation_splits_without_the_training_split(wmt_like):
    """With --streaming the training split streams; the others are read on their own (the helper's case: the
    run said it had no test split although --hub_dataset had one)."""
    spec = DataSpec("hub", str(wmt_like), None, "de", "en")
    assert sorted(load_task_data("seq2seq", spec)) == ["train", "validation"]
    splits = load_task_data("seq2seq", spec, without_train=True)
    assert sorted(splits) == ["validation"]
    assert splits["validation"][1] == {"source": "Satz 9", "target": "sentence 9"}


def test_hub_summarization_columns_detected(tmp_path):
    folder = _hub_folder(
        tmp_path / "cnn", {"train": {"article": ["A long text."], "highlights": ["Short."], "id": ["x1"]}}
    )
    ds = load_hub_dataset(str(folder), split="train")
    assert ds.column_names == ["source", "target"] and ds[0] == {"source": "A long text.", "target": "Short."}
    with pytest.raises(ValueError, match="'body'"):
        load_hub_dataset(str(folder), None, "body", "highlights", split="train")


def test_hub_streaming(wmt_like, tmp_path):
    stream = load_hub_dataset(str(wmt_like), None, "de", "en", split="train", streaming=True)
    assert isinstance(stream, IterableDataset)
    rows = list(stream)
    assert rows[3] == {"source": "Satz 3", "target": "sentence 3"} and len(rows) == 8


# --------------------------------------------------------------------------------------------
# Shared corpora (counts from the README table, cross-checked with an independent reader)


def test_multi30k(shared_data):
    for split, n in [("train", 29000), ("val", 1014), ("test_2016_flickr", 1000)]:
        ds = multi30k(split)
        assert ds.num_rows == n
        assert ds["target"] == _gz_lines(shared_data / "multi30k" / f"{split}.de.gz")
    assert (
        multi30k("test", "fr", "en")[0]["target"]
        == _gz_lines(shared_data / "multi30k" / "test_2016_flickr.en.gz")[0]
    )
    with pytest.raises(ValueError, match="unknown split"):
        multi30k("dev")


def test_wmt_test_sets(shared_data):
    assert wmt_test("en-de", 2013).num_rows == 3000
    de_en = wmt_test("de-en", 2014)
    assert de_en.num_rows == 3003
    assert de_en[5]["source"] == _gz_lines(shared_data / "wmt" / "en-de" / "newstest2014.de.gz")[5]
    assert wmt_test("en-fr", 2014).num_rows == 3003
    ro = wmt_test("en-ro", 2016, "newsdev")
    assert (
        ro.num_rows == 1999
        and ro[0]["target"] == _gz_lines(shared_data / "wmt" / "en-ro" / "newsdev2016.ro.gz")[0]
    )
    with pytest.raises(ValueError, match="no WMT"):
        wmt_test("en-de", 2016)


def test_cnndm(shared_data):
    assert cnndm("train").num_rows == 15981 and cnndm("validation").num_rows == 2000
    cased = cnndm("cased_val1000")
    assert cased.column_names == ["source", "target", "id"] and cased.num_rows == 1000
    assert cased[0]["source"].startswith("(CNN)")


def test_gec_sets_drop_only_empty_pairs(shared_data, caplog):
    for reader, split, folder, src, tgt in [
        (fce, "train", "fce", "fce.train.src.gz", "fce.train.tgt.gz"),
        (wi_locness, "train", "wi_locness", "train.src.gz", "train.tgt.gz"),
        (wi_locness, "dev", "wi_locness", "dev.src.gz", "dev.tgt.gz"),
    ]:
        pairs = list(
            zip(_gz_lines(shared_data / "gec" / folder / src), _gz_lines(shared_data / "gec" / folder / tgt))
        )
        expected = [(s, t) for s, t in pairs if s.strip() and t.strip()]
        ds = reader(split)
        assert list(zip(ds["source"], ds["target"])) == expected
    assert fce("train").num_rows == 13614 - 2  # README: 2 empty target lines
    assert "2 empty line(s) skipped" in caplog.text


def test_jfleg_and_conll2013(shared_data):
    jfleg = jfleg_dev()
    assert jfleg.num_rows == 754 and len(jfleg[0]["references"]) == 4
    assert jfleg[10]["references"][3] == _gz_lines(shared_data / "gec" / "jfleg" / "dev.ref3.gz")[10]
    conll, m2 = conll2013_test()
    assert conll.num_rows == 1381  # all kept, even the one empty reference
    assert sum(line.startswith("S ") for line in _gz_lines(m2)) == 1381
    assert conll[0]["source"] == _gz_lines(m2)[0][2:]


def test_ptb_token_count(shared_data):
    train = ptb("train")
    assert train.column_names == ["text"] and train.num_rows == 42068
    assert sum(len(t.split()) for t in train["text"]) == 887521  # README: training tokens
    assert ptb("valid").num_rows == 3370 and ptb("test").num_rows == 3761


def test_data_dir_env_override(tmp_path, monkeypatch):
    (tmp_path / "multi30k").mkdir()
    _write_gz(tmp_path / "multi30k" / "val.en.gz", b"a dog\n")
    _write_gz(tmp_path / "multi30k" / "val.de.gz", b"ein Hund\n")
    monkeypatch.setenv("ODE_DATA_DIR", str(tmp_path))
    assert multi30k("val")[0] == {"source": "a dog", "target": "ein Hund"}


# --------------------------------------------------------------------------------------------
# load_task_data


def test_task_data_from_shared_and_files(shared_data, tmp_path):
    dd = load_task_data("seq2seq", DataSpec("shared", "multi30k", source_lang="de", target_lang="en"))
    assert {k: v.num_rows for k, v in dd.items()} == {"train": 29000, "validation": 1014, "test": 1000}
    assert dd["validation"][0]["target"] == _gz_lines(shared_data / "multi30k" / "val.en.gz")[0]
    lm = load_task_data("lm", DataSpec("shared", "ptb"))
    assert lm["validation"].num_rows == 3370
    with pytest.raises(ValueError, match="needs columns"):
        load_task_data("seq2seq", DataSpec("shared", "ptb"))
    (tmp_path / "s").write_text("a\nb\n")
    (tmp_path / "t").write_text("A\nB\n")
    files = load_task_data(
        "seq2seq", DataSpec("files", files={"train": (str(tmp_path / "s"), str(tmp_path / "t"))})
    )
    assert list(files) == ["train"] and files["train"]["target"] == ["A", "B"]


def test_task_data_from_hub_folder(tmp_path):
    folder = _hub_folder(
        tmp_path / "hub",
        {
            "train": {"translation": [{"en": "hi", "ro": "salut"}]},
            "valid": {"translation": [{"en": "yes", "ro": "da"}]},
        },
    )
    dd = load_task_data("seq2seq", DataSpec("hub", str(folder), source_lang="en", target_lang="ro"))
    assert sorted(dd) == ["train", "validation"] and dd["validation"][0] == {"source": "yes", "target": "da"}
    with pytest.raises(ValueError, match="unknown shared corpus"):
        load_task_data("seq2seq", DataSpec("shared", "wikitext"))


# --------------------------------------------------------------------------------------------
# LibreOffice help corpus

PAGE = """<!DOCTYPE html><html><head><title>{title}</title><script>var x = "<p>";</script></head><body>
<h1 id="par_idN1" dir="auto">{h1}</h1>
<p id="par_id2" class="paragraph">{p2}</p>
<p id="hd_id3">{hd}</p>
<table><tr><td><p id="par_id4">{p4}</p></td></tr></table>
<div id="par_id5">{p5_outer}<p id="par_id6">{p6}</p></div>
<p id="par_id7"><img src="x.png" alt="icon"></p>
{extra}</body></html>"""

EN = dict(
    title="Table",
    h1='Insert <span class="menuitem">Table</span>',
    p2='Opens  the\n <a href="x">dialog</a>&nbsp;for &lt;b&gt; &amp; co.<br>Next',
    hd="Heading",
    p4="Cell text",
    p5_outer="Outer",
    p6="Inner",
    extra='<p id="par_id8">only English</p>',
)
DE = dict(
    title="Tabelle",
    h1='<span class="menuitem">Tabelle</span> einfügen',
    p2='Öffnet den <a href="x">Dialog</a> für &lt;b&gt; &amp; Co.<br>Weiter',
    hd="Überschrift",
    p4="Zellentext",
    p5_outer="Außen",
    p6="Innen",
    extra="",
)


def _help_tree(root: Path, pages: dict[str, tuple[dict, dict]]) -> tuple[Path, Path]:
    for rel, (en, de) in pages.items():
        for lang, values in (("en-US", en), ("de", de)):
            path = root / lang / "text" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(PAGE.format(**values), encoding="utf-8")
    return root / "en-US" / "text", root / "de" / "text"


def test_extract_paragraphs_strips_html():
    par = lo.extract_paragraphs(PAGE.format(**EN))
    assert par == {
        "par_idN1": "Insert Table",
        "par_id2": "Opens the dialog for <b> & co. Next",
        "par_id4": "Cell text",
        "par_id5": "Outer",
        "par_id6": "Inner",
        "par_id7": "",
        "par_id8": "only English",
    }


def test_split_of_page_is_a_stable_hash_of_the_path():
    # sha256 of the path mod 100, computed once by hand (hashlib): "swriter/p.html" 0 (dev), "schart/page19.html"
    # 8 (test), "swriter/main.html" 90 (train); fixed values, so any change of the rule shows here.
    assert [lo.split_of_page(p) for p in ("swriter/p.html", "schart/page19.html", "swriter/main.html")] == [
        "dev",
        "test",
        "train",
    ]
    pages = [f"m/{i}.html" for i in range(20000)]
    shares = Counter(lo.split_of_page(p) for p in pages)
    assert abs(shares["dev"] / len(pages) - lo.DEV_PERCENT / 100) < 0.005
    assert abs(shares["test"] / len(pages) - lo.TEST_PERCENT / 100) < 0.005


def test_pairing_cleaning_and_page_split(tmp_path):
    same = dict(DE, p4="Cell text")  # an untranslated (identical) paragraph
    en_root, de_root = _help_tree(
        tmp_path,
        {
            "swriter/main.html": (EN, dict(DE, p6="Drinnen")),  # shares "Inner" with the test page
            "shared/01/a.html": (EN, same),
            "smath/page1.html": (dict(EN, p2="Formula"), dict(DE, p2="Formel")),  # a dev page
            "schart/page19.html": (dict(EN, p2="Chart " * 300), dict(DE, p2="Diagramm")),  # a test page
        },
    )
    (en_root / "sdatabase").mkdir()
    (en_root / "sdatabase" / "only_en.html").write_text(PAGE.format(**EN), encoding="utf-8")
    pairs = lo.pair_paragraphs(en_root, de_root)
    main = {p.par_id: (p.en, p.de) for p in pairs if p.page == "swriter/main.html"}
    assert main["par_id2"] == (
        "Opens the dialog for <b> & co. Next",
        "Öffnet den Dialog für <b> & Co. Weiter",
    )
    assert main["par_idN1"] == ("Insert Table", "Tabelle einfügen")
    assert "par_id8" not in main and "hd_id3" not in main  # English-only id; not a par_id
    assert {p.module for p in pairs} == {"swriter", "shared", "smath", "schart"}

    kept, dropped = lo.clean_pairs(pairs, max_chars=1000)
    assert dropped == {"empty": 4, "identical": 1, "too_long": 1, "duplicate": 11}
    texts = {(p.en, p.de) for p in kept}
    assert ("Cell text", "Zellentext") in texts and ("Formula", "Formel") in texts and len(kept) == len(texts)

    splits, overlap = lo.split_by_page(kept)
    pairs_of = {name: [(p.en, p.de) for p in split] for name, split in splits.items()}
    assert pairs_of["dev"] == [("Formula", "Formel")]
    # the test page is the first in path order, so the paragraphs common to all pages stay there
    assert pairs_of["test"] == [
        ("Insert Table", "Tabelle einfügen"),
        ("Cell text", "Zellentext"),
        ("Outer", "Außen"),
        ("Inner", "Innen"),
    ]
    # ("Inner", "Drinnen") from swriter shares its English side with the test set: dropped
    assert pairs_of["train"] == [
        ("Opens the dialog for <b> & co. Next", "Öffnet den Dialog für <b> & Co. Weiter")
    ]
    assert overlap == 1


def _fake_deb(folder: Path, package: str, lang_dir: str, pages: dict[str, str]) -> None:
    pkg = folder / f"build-{package}"
    for rel, html in pages.items():
        path = pkg / "usr/share/libreoffice/help" / lang_dir / "text" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")
    (pkg / "DEBIAN").mkdir()
    (pkg / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1:1.0-1\nArchitecture: all\nMaintainer: t <t@example.org>\nDescription: t\n"
    )
    subprocess.run(
        ["dpkg-deb", "--build", str(pkg), str(folder / f"{package}_1.0-1_all.deb")],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(pkg)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed")
def test_build_corpus_from_debs_is_idempotent(tmp_path):
    debs = tmp_path / "debs"
    debs.mkdir()
    # one page per module: sdatabase's in dev, schart's and smath's in test, swriter's in train
    pages = {"sdatabase": "page26", "schart": "page19", "smath": "page5", "swriter": "page1"}
    pages_en = {
        f"{m}/{p}.html": PAGE.format(**dict(EN, p2=f"{m} text", p4=f"{m} cell")) for m, p in pages.items()
    }
    pages_de = {
        f"{m}/{p}.html": PAGE.format(**dict(DE, p2=f"{m} Text", p4=f"{m} Zelle")) for m, p in pages.items()
    }
    _fake_deb(debs, "libreoffice-help-en-us", "en-US", pages_en)
    _fake_deb(debs, "libreoffice-help-de", "de", pages_de)
    out = tmp_path / "corpus"
    stats = lo.build_corpus(out, debs_dir=debs)
    assert stats["packages"] == {"libreoffice-help-en-us": "1:1.0-1", "libreoffice-help-de": "1:1.0-1"}
    assert stats["license"] == "MPL-2.0"
    lines = {
        name: (out / name).read_text(encoding="utf-8").splitlines()
        for name in ("train.en", "dev.de", "test.de")
    }
    # dedup keeps the first page in path order (schart), so the shared paragraphs land there
    assert lines["test.de"] == [
        "Tabelle einfügen",
        "schart Text",
        "schart Zelle",
        "Außen",
        "Innen",
        "smath Text",
        "smath Zelle",
    ]
    assert lines["dev.de"] == ["sdatabase Text", "sdatabase Zelle"]
    assert lines["train.en"] == ["swriter text", "swriter cell"]
    assert stats["splits"] == {"train": 2, "dev": 2, "test": 7}
    mtime = (out / "train.en").stat().st_mtime_ns
    assert lo.build_corpus(out, debs_dir=tmp_path / "nowhere") == stats  # reused, debs not needed
    assert (out / "train.en").stat().st_mtime_ns == mtime
    # a folder built by another split rule (the old module split) is rebuilt, never passed off as this one
    (out / "stats.json").write_text(json.dumps({**stats, "split_rule": None}), encoding="utf-8")
    (out / "test.de").write_text("stale\n", encoding="utf-8")
    assert lo.build_corpus(out, debs_dir=debs) == stats
    assert (out / "test.de").read_text(encoding="utf-8").splitlines() == lines["test.de"]


def test_build_corpus_missing_debs_says_what_to_do(tmp_path):
    with pytest.raises(lo.CorpusError, match="--debs-dir"):
        lo.build_corpus(tmp_path / "out", debs_dir=tmp_path)


@pytest.mark.slow
def test_real_libreoffice_corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("libreoffice")
    try:
        stats = lo.build_corpus(out)
    except lo.CorpusError as err:
        pytest.skip(f"cannot download the LibreOffice help packages here: {err}")
    splits = {s: (out / f"{s}.en").read_text(encoding="utf-8").splitlines() for s in ("train", "dev", "test")}
    for split, lines in splits.items():
        assert len(lines) == stats["splits"][split]
        assert len((out / f"{split}.de").read_text(encoding="utf-8").splitlines()) == len(lines)
    assert stats["splits"]["train"] > 20000
    assert 800 <= stats["splits"]["dev"] <= 1500 and 1200 <= stats["splits"]["test"] <= 2000
    assert stats["split_rule"] == lo.SPLIT_RULE
    assert {"shared", "swriter", "scalc"} <= set(stats["modules"]["test"])  # held-out pages from every module
    assert not set(splits["test"]) & set(splits["train"])
    ds = load_parallel_files(out / "test.en", out / "test.de")
    assert ds.num_rows == stats["splits"]["test"]


@pytest.mark.parametrize(
    ("reader", "folder"),
    [
        (lambda: data.multi30k("train"), "multi30k"),
        (lambda: data.wmt_test("en-de", 2014), "wmt"),
        (lambda: data.cnndm("train"), "summarization"),
        (lambda: data.fce("train"), "gec/fce"),
        (lambda: data.wi_locness("train"), "gec/wi_locness"),
        (lambda: data.jfleg_dev(), "gec/jfleg"),
        (lambda: data.ptb("train"), "ptb"),
    ],
)
def test_every_corpus_reader_names_odes_data_dir_when_its_folder_is_missing(
    reader, folder, tmp_path, monkeypatch
):
    """From an install (no ../shared beside the package), every corpus reader says which folder it looked for
    and how to point at the data (ODE_DATA_DIR, root=DIR), not a file under site-packages with no fix."""
    monkeypatch.setenv("ODE_DATA_DIR", str(tmp_path))
    with pytest.raises(data.MissingCorpusError) as error:
        reader()
    message = str(error.value)
    assert f"no folder {tmp_path / folder}" in message and "ODE_DATA_DIR=DIR" in message
    assert "root=DIR" in message and f"holds {folder}/" in message


def test_streamed_rows_are_the_whole_file_readers_rows_with_its_checks(tmp_path):
    """`--streaming true` reads local files line by line (iter_local_rows): the same rows as load_local_file, and
    the same refusals, named: a missing TSV column, a JSONL field no row fills, JSON for a language model, and
    files of different line counts, rather than zero rows, raw JSON as text, or a bare zip() error."""
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_text("one\n\ntwo\nthree\n", encoding="utf-8")
    tgt.write_text("eins\nleer\nzwei\ndrei\n", encoding="utf-8")
    tsv = tmp_path / "a.tsv"
    tsv.write_text("en\tde\none\teins\n\t\ntwo\tzwei\n", encoding="utf-8")
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(
        '{"t": {"en": "one", "de": "eins"}}\n\n{"t": {"en": "two", "de": "zwei"}}\n', encoding="utf-8"
    )
    for spec, columns in (
        (f"{src},{tgt}", ("source", "target")),
        (str(tsv), ("en", "de")),
        (str(jsonl), ("t.en", "t.de")),
    ):
        whole = load_local_file(spec, "seq2seq", *columns)
        assert list(iter_local_rows(spec, "seq2seq", *columns)) == [
            {"source": s, "target": t} for s, t in zip(whole["source"], whole["target"])
        ], spec
    with pytest.raises(ValueError, match=r"column 'fr' not found in .*a\.tsv"):
        next(iter_local_rows(str(tsv), "seq2seq", "en", "fr"))
    with pytest.raises(ValueError, match=r"a\.jsonl has no row with text in both 't\.en' and 't\.fr'"):
        list(iter_local_rows(str(jsonl), "seq2seq", "t.en", "t.fr"))
    with pytest.raises(ValueError, match="a language model trains on a plain text file"):
        next(iter_local_rows(str(jsonl), "lm"))
    tgt.write_text("eins\nleer\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"a\.en and .*a\.de have different line counts"):
        list(iter_local_rows(f"{src},{tgt}", "seq2seq"))
