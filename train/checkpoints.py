"""Checkpoints that are either complete or absent, and which run wrote them.

* A checkpoint is written into ``OUTPUT_DIR/.staging/checkpoint-<step>`` and renamed to
  ``OUTPUT_DIR/checkpoint-<step>`` once every file is in it (:func:`publish`); a rename within one
  file system is atomic, so a kill during the save leaves no ``checkpoint-<step>`` folder, only a
  staging folder that the next save or resume removes.
* Every checkpoint holds ``run_id.txt``, the id of the run that wrote it (a resumed run keeps the id
  of the checkpoint it resumes from), so checkpoints of different runs are never mixed, e.g. by
  averaging (:func:`check_one_run`).
* :func:`complete_checkpoints` lists the complete ``checkpoint-<step>`` folders (weights and
  ``trainer_state.json``, which the trainer writes last); incomplete ones, left by a kill before
  this scheme or by a copy, are skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "RUN_ID_FILE",
    "STAGING",
    "check_one_run",
    "complete_checkpoints",
    "missing_part",
    "new_run_id",
    "publish",
    "read_run_id",
    "remove_staging",
]

logger = logging.getLogger(__name__)

STAGING = ".staging"
"""Folder of ``OUTPUT_DIR`` in which checkpoints are written before they are renamed into place."""
RUN_ID_FILE = "run_id.txt"
TRAINER_STATE = "trainer_state.json"
WEIGHTS = "model.safetensors"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def new_run_id() -> str:
    return uuid.uuid4().hex


def read_run_id(checkpoint: str | Path) -> str | None:
    """The id of the run that wrote ``checkpoint`` (``None`` for checkpoints written without one)."""
    path = Path(checkpoint) / RUN_ID_FILE
    return path.read_text(encoding="utf-8").strip() if path.is_file() else None


def missing_part(checkpoint: Path) -> str | None:
    """What makes ``checkpoint`` incomplete, or ``None``."""
    if not (checkpoint / WEIGHTS).is_file():
        return f"no {WEIGHTS}"
    try:
        json.loads((checkpoint / TRAINER_STATE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {TRAINER_STATE}"
    except ValueError:
        return f"a cut-off {TRAINER_STATE}"
    return None


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """The complete ``checkpoint-<step>`` folders of ``output_dir``, oldest first; others are skipped with a warning."""
    folder = Path(output_dir)
    found = sorted(
        (int(match.group(1)), path)
        for path in (folder.iterdir() if folder.is_dir() else ())
        if (match := _CHECKPOINT.match(path.name)) and path.is_dir()
    )
    complete = []
    for _, path in found:
        problem = missing_part(path)
        if problem is None:
            complete.append(path)
        else:
            logger.warning(
                "skipping incomplete checkpoint %s (%s): an interrupted save left it", path, problem
            )
    return complete


def check_one_run(checkpoints: Sequence[str | Path]) -> str | None:
    """The run id shared by ``checkpoints``; a ValueError names them when they come from different runs."""
    ids = {str(path): read_run_id(path) for path in checkpoints}
    if len(set(ids.values())) > 1:
        listing = ", ".join(f"{Path(path).name}: {run or 'no run id'}" for path, run in ids.items())
        raise ValueError(
            f"the checkpoints come from different training runs ({listing}); average checkpoints of one run "
            "only (train into an empty --output_dir, or pass --overwrite_output_dir to clear it)."
        )
    return next(iter(ids.values()), None)


def publish(staged: Path, final: Path) -> None:
    """Move the fully written ``staged`` checkpoint to ``final`` (an existing ``final`` is replaced)."""
    if final.exists():  # re-saving a step after resuming from an earlier checkpoint
        old = staged.with_name(staged.name + ".old")
        final.rename(old)
        staged.rename(final)
        shutil.rmtree(old)
    else:
        staged.rename(final)
    if not any(staged.parent.iterdir()):
        staged.parent.rmdir()


def remove_staging(output_dir: str | Path) -> None:
    """Delete checkpoints an interrupted save left half-written in ``OUTPUT_DIR/.staging``."""
    staging = Path(output_dir) / STAGING
    if staging.is_dir():
        for partial in sorted(staging.iterdir()):
            logger.warning("removing %s: a save was interrupted while writing it", partial)
        shutil.rmtree(staging)
