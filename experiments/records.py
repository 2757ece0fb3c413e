"""The result records of a study's batch (``results/<study>/<size>[_<batch>]/*.json``, one per run, written by
``experiments.run``): reading one, reading a batch folder, and merging a JSON file that several writers add to
(``diagnostics/gates.json``).

Every reader of a batch goes through :func:`load_results`, so that every command refuses the same things with the
same line: a record that is not complete JSON, lacks what a run records, has no value or a NaN for one of its
study's metrics, or a folder whose records mix code commits, devices or precisions (runs that do not compare: one
batch is one commit, one device and one precision). Each refusal names the files and the fix.

Only the standard library at import (the lease imports this on a bare Python); the lock library is imported where a
file is merged.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from experiments.studies import STUDIES

# What every run's record holds, whatever its study (a file without them was cut off or is not a record)
REQUIRED = ("variant", "seed", "metrics")
# How long a merge waits for another writer of the same file (a merge takes milliseconds)
MERGE_WAIT_S = 120.0
# The parts of comparable(), as a refusal names them
PROVENANCE = ("commit", "device", "CPU capability", "precision")
_SHOWN_FILES = 3  # per group, in a refusal: the rest are counted


class RecordError(ValueError):
    """A file of the machinery (a run's record, a batch folder, a merged JSON file, a lease's archive) that cannot
    be used as one: the file and the fix named, in one line."""


class MixedBatchError(RecordError):
    """A batch folder whose records mix commits, devices or precisions."""


def comparable(result: dict[str, Any]) -> tuple:
    """What two runs must share for their scores to be compared: the code's commit, the device (CPU model and
    the kernels PyTorch ran: its capability, where recorded) and the training precision (recorded, or read from
    the flags of runs made before it was)."""
    device = result.get("device") or {}
    recorded = (result.get("precision") or {}).get("precision")
    precision = recorded or ("bf16" if (result.get("flags") or {}).get("bf16") else "fp32")
    commit = (result.get("git") or {}).get("commit")
    return commit, device.get("name"), device.get("capability"), precision


def read_record(path: Path, shown: str | None = None) -> dict[str, Any]:
    """One run's record, checked: complete JSON, the keys every record has, and a finite value for each metric its
    study records (a study this checkout does not define is checked for the common keys only). ``shown``: the
    file's name in messages, where it was unpacked elsewhere (a lease's archive).

    Raises:
        RecordError: what is wrong, the file and the fix.
    """
    redo = "delete it and run that run again (experiments.run resumes or retrains it)"
    where = shown or str(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise RecordError(
            f"{where} is not complete JSON ({error.msg}, line {error.lineno}): a write was cut off or the file was "
            f"edited; {'' if shown else f'restore it (git restore {path}) or '}{redo}"
        ) from None
    except UnicodeDecodeError:
        raise RecordError(f"{where} is not UTF-8 text, so not a result record; {redo}") from None
    missing = [key for key in REQUIRED if not isinstance(record, dict) or key not in record]
    if missing or not isinstance(record["metrics"], dict):
        what = f"lacks {', '.join(missing)}" if missing else "has no metrics table"
        raise RecordError(
            f"{where} is not a run's result record: it {what} (half-written or made by hand); {redo}"
        )
    study = STUDIES.get(record.get("study"))
    # the metrics every run of its study records (a derived one, Metric.per_word_of, is the report's)
    recorded = [m.per_word_of or m.name for m in study.metrics] if study else []
    for name in dict.fromkeys([*recorded, *record["metrics"]]):
        value = record["metrics"].get(name)
        if value is None:
            raise RecordError(
                f"{where} has no {name!r} metric, which every run of {record['study']} records (its test did not "
                f"finish); {redo}"
            )
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RecordError(
                f"{where} has metric {name!r} = {value!r}, not a number (the run diverged, or its test failed); "
                f"{redo}, or move it out of the batch"
            )
    return record


def record_files(folder: Path) -> list[Path]:
    """The run records of a batch folder (its ``summary.json`` is the report's, not a run's)."""
    return [path for path in sorted(folder.glob("*.json")) if path.name != "summary.json"]


def mixing(named: list[tuple[str, dict[str, Any]]]) -> str | None:
    """What records (each with the name to show) mix, among :func:`comparable`'s parts: ``commit abc1234 (a.json,
    b.json) / def5678 (c.json)``, a part per ``; ``; None where they share them all."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for name, record in named:
        groups[comparable(record)].append(name)
    if len(groups) < 2:
        return None
    parts = []
    for index, part in enumerate(PROVENANCE):
        by_value: dict[str, list[str]] = defaultdict(list)
        for key, names in groups.items():
            by_value[_shown(part, key[index])] += names
        if len(by_value) > 1:
            parts.append(
                f"{part} " + " / ".join(f"{value} ({_files(names)})" for value, names in by_value.items())
            )
    return "; ".join(parts)


def _shown(part: str, value: Any) -> str:
    return str(value)[:7] if part == "commit" and value else str(value)


def _files(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:_SHOWN_FILES])
    return shown + (f" and {len(names) - _SHOWN_FILES} more" if len(names) > _SHOWN_FILES else "")


def load_results(folder: Path, mixed: bool = False) -> list[dict[str, Any]]:
    """Every run record of a batch folder (:func:`read_record`, in file-name order). A folder whose records mix
    commits, devices or precisions is refused unless ``mixed`` (then its reader pairs only runs that share them).

    Raises:
        RecordError: a record that is not one (its file named).
        MixedBatchError: the folder mixes them (the files of each side named).
    """
    paths = record_files(folder)
    records = [read_record(path) for path in paths]
    if not mixed and (what := mixing([(path.name, record) for path, record in zip(paths, records)])):
        raise MixedBatchError(
            f"{folder} mixes runs of {what}: one batch is one commit, one device and one precision; move one side's "
            "runs to a batch of their own (experiments.run --batch LABEL), or report the folder with "
            "`experiments.report --mixed`, which pairs only runs that share all three"
        )
    return records


def merge_json(path: Path, new: dict[str, Any], keep_existing: bool = False) -> None:
    """Add the entries of ``new`` to the JSON object in ``path`` (created if missing), keys sorted: read, merged
    and written under a lock beside it (``.NAME.lock``; another writer waits for it), and written whole or not at
    all, so that two writers at once (parallel runs, two lease collects) both keep their entries. An entry already
    there is replaced, or kept where ``keep_existing``.

    Raises:
        RecordError: the file there is not a JSON object (named, with the fix).
    """
    from filelock import FileLock

    from ode_transformer.files import real_path, write_atomic

    target = real_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_file = target.with_name(f".{target.name}.lock")
    with FileLock(lock_file, timeout=MERGE_WAIT_S):
        old = {}
        if target.is_file():
            try:
                old = json.loads(target.read_text(encoding="utf-8"))
            except json.JSONDecodeError as error:
                old = error  # refused below, outside the except: one line, no chained trace
            if not isinstance(old, dict):
                raise RecordError(
                    f"{path} is not a JSON object of runs, so nothing can be merged into it; restore it "
                    f"(git restore {path}) or delete it and write its runs again"
                )
        merged = {**new, **old} if keep_existing else {**old, **new}
        write_atomic(target, json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
        # removed while held, as ode_transformer.files.hold_lock does: a waiting writer sees it unlinked and retries
        lock_file.unlink(missing_ok=True)


Main = TypeVar("Main", bound=Callable[..., Any])


def refuse_bad_records(prog: str) -> Callable[[Main], Main]:
    """Decorate a command's ``main``: a :class:`RecordError` ends it with one line on stderr, ``PROG: error: ...``,
    and exit code 2 (argparse's for a refused input), never a traceback."""

    def decorate(main: Main) -> Main:
        @functools.wraps(main)
        def refusing(*args: Any, **kwargs: Any) -> Any:
            try:
                return main(*args, **kwargs)
            except RecordError as error:
                print(f"{prog}: error: {error}", file=sys.stderr)
                raise SystemExit(2) from None

        return refusing  # type: ignore[return-value]

    return decorate
