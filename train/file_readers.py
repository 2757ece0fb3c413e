"""Readers of local files, as :mod:`datasets` objects: line-aligned plain text (optionally ``.gz``), TSV with a
header, JSON lines (or one JSON array), a language model's plain text, and a training file read line by line.

Seq2seq rows have the columns ``source`` and ``target``; a language model's rows have the column ``text``. No line
is lost in silence: every skipped, replaced or empty line is logged as a warning with its line numbers.

* :func:`load_parallel_files` (aligned text files), :func:`load_tsv`, :func:`load_jsonl`;
* :func:`load_local_file`: one split from any of these, as ``--train_file`` and its siblings name it;
* :func:`iter_local_rows`: the same rows, one line at a time (``--streaming true``).

The shared corpora that are read with them are :mod:`ode_transformer.train.data`'s.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Literal

from datasets import Dataset

from ode_transformer.files import read_byte_lines, read_lines

__all__ = [
    "aligned_dataset",
    "check_fields",
    "iter_local_rows",
    "load_jsonl",
    "load_local_file",
    "load_parallel_files",
    "load_tsv",
    "read_aligned",
]

logger = logging.getLogger(__name__)

_SHOWN_LINES = 5  # line numbers quoted in warnings

PathLike = str | os.PathLike

# --------------------------------------------------------------------------------------------
# Aligned plain-text files


@dataclass
class _LineReport:
    """What a loader read and what it dropped, for its warning: line numbers are 1-based, in the original files."""

    files: list[str]
    lines: int
    kept: int
    empty_lines: list[int] = field(default_factory=list)
    undecodable_lines: list[int] = field(default_factory=list)


def _decode(line: bytes) -> str | None:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_aligned(paths: Mapping[str, Path], skip_empty: bool) -> dict[str, list[str]]:
    """Read line-aligned files into columns; misalignment is an error, bad lines are skipped and reported."""
    raw = {name: read_byte_lines(path) for name, path in paths.items()}
    counts = {name: len(lines) for name, lines in raw.items()}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{paths[name]}: {n} lines" for name, n in counts.items())
        raise ValueError(f"files are not aligned (different line counts): {detail}")
    n_lines = next(iter(counts.values()), 0)
    stats = _LineReport(files=[str(p) for p in paths.values()], lines=n_lines, kept=0)
    columns: dict[str, list[str]] = {name: [] for name in paths}
    for i, row in enumerate(zip(*raw.values()), start=1):
        texts = [_decode(line) for line in row]
        if any(text is None for text in texts):
            stats.undecodable_lines.append(i)
            if skip_empty:
                continue
            # an evaluation set keeps every line, aligned with its references and hypotheses
            texts = [line.decode("utf-8", errors="replace") for line in row]
        if any(not text.strip() for text in texts):
            stats.empty_lines.append(i)
            if skip_empty:
                continue
        for name, text in zip(columns, texts):
            columns[name].append(text)
    stats.kept = len(next(iter(columns.values()), []))
    _warn_skipped(stats, skip_empty)
    return columns


def _warn_skipped(stats: _LineReport, skip_empty: bool) -> None:
    """Never a silent loss of data: each kind of bad line, its count, its first line numbers, and what is left."""
    for what, lines, action in (
        ("undecodable (non-UTF-8)", stats.undecodable_lines, "skipped" if skip_empty else "kept as U+FFFD"),
        ("empty", stats.empty_lines, "skipped" if skip_empty else "kept"),
    ):
        if lines:
            logger.warning(
                "%s: %d %s line(s) %s (line numbers %s%s); %d of %d rows loaded",
                " / ".join(stats.files),
                len(lines),
                what,
                action,
                ", ".join(map(str, lines[:_SHOWN_LINES])),
                ", ..." if len(lines) > _SHOWN_LINES else "",
                stats.kept,
                stats.lines,
            )


def aligned_dataset(paths: Mapping[str, PathLike], skip_empty: bool) -> Dataset:
    """A dataset of line-aligned files, one column per file (:func:`read_aligned`)."""
    return Dataset.from_dict(read_aligned({name: Path(p) for name, p in paths.items()}, skip_empty))


def load_parallel_files(src_path: PathLike, tgt_path: PathLike, skip_empty: bool = True) -> Dataset:
    """Load two line-aligned UTF-8 text files (``.gz`` allowed) as a ``source``/``target`` dataset.

    Args:
        src_path: source-side file, one segment per line.
        tgt_path: target-side file, same number of lines.
        skip_empty: drop pairs where either side is empty/whitespace-only or not UTF-8 (training); with
            ``False`` every line is kept (evaluation sets that must stay aligned with references and
            hypotheses), undecodable bytes as U+FFFD.

    Raises:
        ValueError: the files have different line counts (both files and counts named).

    Every dropped, replaced or empty line is logged as a warning (count, first line numbers, and how
    many rows are left).
    Text is kept verbatim (only a trailing ``\\r`` is removed).
    """
    return aligned_dataset({"source": src_path, "target": tgt_path}, skip_empty)


# --------------------------------------------------------------------------------------------
# TSV and JSON lines


def check_fields(columns: Sequence[str], fields: Sequence[str], where: str, choose: str) -> None:
    """Refuse a field missing from ``columns``, naming it, ``where`` it was looked for, the columns there and the
    flags that ``choose`` others."""
    for name in fields:
        if name not in columns:
            raise ValueError(
                f"column {name!r} not found in {where}; available columns: {list(columns)} (choose with {choose})"
            )


def _refuse_empty_file(path: PathLike, lines: Sequence[str], header: bool) -> None:
    if sum(1 for line in lines if line.strip()) <= (1 if header else 0):
        rows = "rows below its header" if header else "lines"
        raise ValueError(f"{path} has no {rows}: pass a file with data, or leave that split out.")


def _pairs_dataset(
    sources: list[object], targets: list[object], path: PathLike, first_line: int, skip_empty: bool
) -> Dataset:
    """A ``source``/``target`` dataset of a file's rows (row 0 is line ``first_line``): rows with a missing (None)
    or blank side are dropped with :func:`load_parallel_files`' warning, or, without ``skip_empty``, kept with
    ``""`` for a missing value.

    Raises:
        ValueError: a value is neither text nor missing (a number, list or object; file, line and field named).
    """
    for side, values in (("source", sources), ("target", targets)):
        for i, value in enumerate(values):
            if value is not None and not isinstance(value, str):
                raise ValueError(
                    f"{path}, line {i + first_line}: the {side} is a {type(value).__name__} ({str(value)[:40]!r}), "
                    "not text; give every source and target as a string (or convert the file first)."
                )
    empty = {
        i
        for i, (source, target) in enumerate(zip(sources, targets))
        if source is None or target is None or not source.strip() or not target.strip()
    }
    stats = _LineReport(
        files=[str(path)],
        lines=len(sources),
        kept=len(sources) - (len(empty) if skip_empty else 0),
        empty_lines=[i + first_line for i in sorted(empty)],
    )
    _warn_skipped(stats, skip_empty)
    rows = [i for i in range(len(sources)) if not (skip_empty and i in empty)]
    return Dataset.from_dict(
        {"source": [sources[i] or "" for i in rows], "target": [targets[i] or "" for i in rows]}
    )


def load_tsv(path: PathLike, source_column: str, target_column: str, skip_empty: bool = True) -> Dataset:
    """Load a tab-separated file with a header row (``.gz`` allowed) as ``source``/``target``.

    Every line below the header is a row, read as text (quotes are not special, ``007`` stays ``007``). Rows with
    a missing or blank source or target, blank lines included, are skipped (kept with ``skip_empty=False``) with a
    warning naming their line numbers, as :func:`load_parallel_files` does.

    Raises:
        ValueError: a column is missing (message names it, the file and the existing columns), the file has no
            rows below its header, a row has more fields than the header (a tab inside a text would shift every
            later field into the wrong column), or a line is not UTF-8 (file and line named).
    """
    lines = read_lines(path)
    _refuse_empty_file(path, lines, header=True)
    header = lines[0].split("\t")
    check_fields(header, [source_column, target_column], str(path), "--source_column/--target_column")
    source, target = header.index(source_column), header.index(target_column)
    sources: list[object] = []
    targets: list[object] = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) > len(header):
            raise ValueError(
                f"{path}, line {number}: {len(fields)} tab-separated fields, but the header has {len(header)}; a "
                "text that holds a tab must lose it (or write the file as JSONL)."
            )
        sources.append(fields[source] if source < len(fields) else None)
        targets.append(fields[target] if target < len(fields) else None)
    return _pairs_dataset(sources, targets, path, first_line=2, skip_empty=skip_empty)


def _optional_field(record: Mapping, name: str) -> object:
    """``record[name]``, where ``a.b`` reads key ``b`` of the object in field ``a``; None where a key (or the object
    holding it) is missing."""
    value: object = record
    for part in name.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _field_names(record: Mapping, prefix: str = "") -> Iterator[str]:
    """The fields of a record as ``--source_column`` names them: ``a`` and, inside an object, ``a.b``."""
    for key, value in record.items():
        yield prefix + key
        if isinstance(value, Mapping):
            yield from _field_names(value, f"{prefix}{key}.")


def _json_records(path: PathLike, lines: list[str]) -> list[Mapping]:
    """One record per line (JSON lines; a blank line is an empty record), or the objects of a ``.json`` file that
    holds one JSON array (as datasets' json builder reads it)."""
    first = next((line for line in lines if line.strip()), "")
    if str(path).removesuffix(".gz").endswith(".json") and first.lstrip().startswith("["):
        try:
            array = json.loads("\n".join(lines))
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}, line {error.lineno}: not JSON ({error.msg} at column {error.colno}); fix that line."
            ) from None
        if not all(isinstance(record, dict) for record in array):
            raise ValueError(f"{path}: a JSON array of objects is needed, one per example")
        return array
    records: list[Mapping] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            records.append({})
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}, line {number}: not a JSON object ({error.msg} at column {error.colno}); fix or remove "
                "that line."
            ) from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}, line {number}: not a JSON object (a JSON {type(record).__name__}); fix or remove that line."
            )
        records.append(record)
    return records


def load_jsonl(path: PathLike, source_field: str, target_field: str, skip_empty: bool = True) -> Dataset:
    """Load a JSON-lines file (``.gz`` allowed; a ``.json`` file may hold one array of objects instead) as
    ``source``/``target``.

    A field ``a.b`` reads key ``b`` of the object in field ``a`` (e.g. ``translation.de``). Records with
    a missing, null or blank source or target, blank lines included, are skipped (kept with ``skip_empty=False``)
    with a warning naming their line numbers.

    Raises:
        ValueError: a field is missing from every record (message names it, the file and the existing fields),
            the file is empty, or a line is not UTF-8 or not a JSON object (file and line named).
    """
    lines = read_lines(path)
    _refuse_empty_file(path, lines, header=False)
    records = _json_records(path, lines)
    columns = list(dict.fromkeys(name for record in records for name in _field_names(record)))
    check_fields(
        columns,
        [source_field, target_field],
        str(path),
        "--source_column/--target_column; a.b reads key b of field a, e.g. translation.en",
    )
    sources = [_optional_field(record, source_field) for record in records]
    targets = [_optional_field(record, target_field) for record in records]
    return _pairs_dataset(sources, targets, path, first_line=1, skip_empty=skip_empty)


# --------------------------------------------------------------------------------------------
# One split from local files, whole or line by line


def _text_dataset(path: str, skip_empty: bool) -> Dataset:
    """A language model's ``text`` rows, one per line (stripped): a blank line would train on ``<s>`` alone, so a
    training split drops blank lines with :func:`load_parallel_files`' warning; an evaluation split keeps them."""
    lines = [line.strip() for line in read_lines(path)]
    blank = [number for number, line in enumerate(lines, start=1) if not line]
    kept = [line for line in lines if line] if skip_empty else lines
    _warn_skipped(_LineReport([path], len(lines), len(kept), empty_lines=blank), skip_empty)
    return Dataset.from_dict({"text": kept})


def _file_pair(spec: str) -> tuple[str, str]:
    """``"SRC,TGT"`` split at its first comma; a path holding a comma of its own is named with the fix."""
    source, target = spec.split(",", 1)
    both_exist = Path(source).is_file() and Path(target).is_file()
    if not both_exist and (Path(spec).is_file() or spec.count(",") > 1):
        raise ValueError(
            f"{spec!r}: a path holds a comma, but 'SRC,TGT' is split at the first comma (into {source!r} and "
            f"{target!r}); rename the file, or link it under a name without a comma"
        )
    return source, target


def _check_lm_text_file(spec: str, name: str) -> None:
    if name.endswith((".tsv", ".jsonl", ".json")):  # read as text, its JSON or header would be learned
        raise ValueError(
            f"{spec}: a language model trains on a plain text file, one sequence per line; write the file's text "
            "column to a .txt file first (e.g. jq -r .text FILE.jsonl > FILE.txt)"
        )


def iter_local_rows(
    spec: str,
    kind: Literal["seq2seq", "lm"],
    source_column: str = "source",
    target_column: str = "target",
    lines: int | None = None,
) -> Iterator[dict]:
    """The training rows of :func:`load_local_file`, read one line at a time (``--streaming true``): memory does not
    grow with the file. The same formats and checks (columns, a language model's plain text, aligned pairs); blank
    or empty-sided rows (a JSONL record without the fields asked for) are skipped with :func:`load_local_file`'s
    warning, given once the file is read to its end. ``lines``: the first ``lines`` rows only, their skipped ones
    warned about (:func:`ode_transformer.train.preparation.stream_local_file` reads them ahead of training).

    Raises:
        ValueError: as :func:`load_local_file`; a TSV/JSONL file read to its end without a row with text in both
            fields (JSONL's fields are not known before reading it all).
    """
    report = _LineReport(files=[spec], lines=0, kept=0)
    for number, row in _numbered_rows(spec, kind, source_column, target_column):
        if lines is not None and report.lines == lines:
            report.files = [f"{spec} (its first {lines} rows, read ahead)"]
            break
        report.lines += 1
        if row is None:
            report.empty_lines.append(number)
            continue
        report.kept += 1
        yield row
    else:
        if not report.kept and spec.removesuffix(".gz").endswith((".tsv", ".jsonl")):
            raise ValueError(
                f"{spec} has no row with text in both {source_column!r} and {target_column!r}: choose them with "
                "--source_column/--target_column (a.b reads key b of field a, e.g. translation.en)"
            )
    _warn_skipped(report, skip_empty=True)


def _numbered_rows(
    spec: str, kind: Literal["seq2seq", "lm"], source_column: str, target_column: str
) -> Iterator[tuple[int, dict | None]]:
    """(line number, row) of a local training file, read line by line; the row is None where the line is blank or
    lacks a side."""
    name = spec.removesuffix(".gz")
    if kind == "lm":
        _check_lm_text_file(spec, name)
        with _open_text(spec) as lines:
            for number, line in enumerate(lines, start=1):
                yield number, {"text": line.strip()} if line.strip() else None
        return
    if "," in spec:
        source, target = _file_pair(spec)
        with _open_text(source) as sources, _open_text(target) as targets:
            for number, (src, tgt) in enumerate(zip_longest(sources, targets), start=1):
                if src is None or tgt is None:
                    raise ValueError(
                        f"{source} and {target} have different line counts (one ends at line {number - 1}): give "
                        "line-aligned files, one segment per line"
                    )
                src, tgt = src.rstrip("\r\n"), tgt.rstrip("\r\n")
                yield number, {"source": src, "target": tgt} if src.strip() and tgt.strip() else None
        return
    if not name.endswith((".tsv", ".jsonl")):
        raise ValueError(
            f"--streaming true reads 'SRC,TGT' text files or a .tsv/.jsonl file line by line, not {spec!r}"
        )
    with _open_text(spec) as lines:
        header = next(lines, "").rstrip("\r\n").split("\t") if name.endswith(".tsv") else None
        if header is not None:
            check_fields(header, [source_column, target_column], spec, "--source_column/--target_column")
        for number, line in enumerate(lines, start=2 if header else 1):
            src = tgt = None
            if line.strip() and header is None:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{spec}, line {number}: not a JSON object ({error.msg})") from None
                src, tgt = _optional_field(record, source_column), _optional_field(record, target_column)
            elif line.strip():
                fields = dict(zip(header, line.rstrip("\r\n").split("\t")))
                src, tgt = fields.get(source_column), fields.get(target_column)
            texts = isinstance(src, str) and isinstance(tgt, str) and src.strip() and tgt.strip()
            yield number, {"source": src, "target": tgt} if texts else None


def _open_text(path: str):
    return (
        gzip.open(path, "rt", encoding="utf-8-sig")
        if path.endswith(".gz")
        else open(path, encoding="utf-8-sig")
    )


def load_local_file(
    spec: tuple[str, str] | str,
    kind: Literal["seq2seq", "lm"],
    source_column: str = "source",
    target_column: str = "target",
    skip_empty: bool = True,
) -> Dataset:
    """One split from local files: ``(SRC, TGT)`` or ``"SRC,TGT"`` aligned text files, a TSV/JSONL file
    (``.gz`` allowed; columns ``source_column``/``target_column``) or, for ``lm``, one text file (a ``text``
    row per line, stripped). ``skip_empty=False`` keeps every row (an evaluation split)."""
    name = spec.removesuffix(".gz") if isinstance(spec, str) else ""
    if kind == "lm":
        _check_lm_text_file(spec, name)
        return _text_dataset(spec, skip_empty)
    if isinstance(spec, tuple) or "," in spec:
        return load_parallel_files(*(spec if isinstance(spec, tuple) else _file_pair(spec)), skip_empty)
    if name.endswith(".tsv"):
        return load_tsv(spec, source_column, target_column, skip_empty=skip_empty)
    if name.endswith((".jsonl", ".json")):
        return load_jsonl(spec, source_column, target_column, skip_empty=skip_empty)
    raise ValueError(f"cannot read {spec!r}: give 'SRC,TGT' text files or a .tsv/.jsonl file")
