"""Checkpoints that are either complete or absent, and which run wrote them.

* A checkpoint is written into ``OUTPUT_DIR/.staging/checkpoint-<step>`` and renamed to
  ``OUTPUT_DIR/checkpoint-<step>`` once every file is in it (:func:`publish`); a rename within one
  file system is atomic, so a kill during the save leaves no ``checkpoint-<step>`` folder, only a
  staging folder that the next save or resume removes.
* Every checkpoint holds ``run_id.txt``, the id of the run that wrote it (a resumed run keeps the id
  of the checkpoint it resumes from), so checkpoints of different runs are never mixed, e.g. by
  averaging (:func:`check_one_run`).
* One run at a time per folder: :func:`lock_output_dir` holds ``OUTPUT_DIR/.run.lock``, and the folder's lock
  beside it, which an export or averaging into the folder takes too, for the run's lifetime (a second writer
  started at once is refused, naming the first one's pid).
* :func:`complete_checkpoints` lists the complete ``checkpoint-<step>`` folders (weights and
  ``trainer_state.json``, which the trainer writes last); incomplete ones, left by a kill before
  this scheme or by a copy, are skipped with a warning.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .files import (
    InUseError,
    hold_lock,
    lock_output,
    real_path,
    refuse_occupied,
    refuse_replacing_inputs,
    replace_folder,
    staged_folder,
)

__all__ = [
    "FINAL_MODEL_STAGING",
    "LOCK_FILES",
    "RUN_ID_FILE",
    "STAGING",
    "check_checkpoint_pickles",
    "check_one_run",
    "complete_checkpoints",
    "lock_output_dir",
    "missing_part",
    "new_run_id",
    "publish",
    "read_run_id",
    "refuse_replacing_a_run",
    "refuse_replacing_output",
    "remove_staging",
    "run_contents",
    "unsafe_pickle_message",
    "writing_output_folder",
]

logger = logging.getLogger(__name__)

STAGING = ".staging"
"""Folder of ``OUTPUT_DIR`` in which checkpoints are written before they are renamed into place."""
FINAL_MODEL_STAGING = "final_model"
"""Folder of ``STAGING`` in which the run's final model is written before its files are renamed into place."""
RUN_ID_FILE = "run_id.txt"
TRAINER_STATE = "trainer_state.json"
WEIGHTS = "model.safetensors"
LOCK_FILE, PID_FILE = ".run.lock", ".run.pid"
LOCK_FILES = (LOCK_FILE, PID_FILE)
"""Files of ``OUTPUT_DIR`` that say which process runs in it (not part of the run's outputs)."""
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
    """Move the fully written ``staged`` checkpoint to ``final`` (an existing ``final`` is replaced: re-saving a
    step after resuming from an earlier checkpoint)."""
    replace_folder(staged, final)
    if not any(staged.parent.iterdir()):
        staged.parent.rmdir()


def remove_staging(output_dir: str | Path) -> None:
    """Delete checkpoints an interrupted save left half-written in ``OUTPUT_DIR/.staging``."""
    staging = Path(output_dir) / STAGING
    if staging.is_dir():
        for partial in sorted(staging.iterdir()):
            logger.warning("removing %s: a save was interrupted while writing it", partial)
        shutil.rmtree(staging)


def run_contents(folder: str | Path) -> list[str]:
    """What makes ``folder`` a training run's: its ``checkpoint-<step>`` folders, checkpoint staging, trainer state
    and run lock (empty for any other folder)."""
    path = Path(folder)
    if not path.is_dir():
        return []
    checkpoints = [  # an empty one holds nothing of a run (left by a copy, or made by hand)
        p.name for p in path.iterdir() if _CHECKPOINT.match(p.name) and p.is_dir() and any(p.iterdir())
    ]
    checkpoints.sort(key=lambda name: int(name.split("-")[1]))
    return checkpoints + [name for name in (STAGING, TRAINER_STATE, LOCK_FILE) if (path / name).exists()]


def refuse_replacing_a_run(
    folder: str | Path,
    inputs: Sequence[str | Path | None],
    option: str,
    overwrite: bool = False,
    suffix: str = "export",
) -> None:
    """A tool's output folder (``ode-export``, averaging, conversion) is never one that holds its own inputs
    (:func:`ode_transformer.files.refuse_replacing_inputs`) or a training run's checkpoints and state,
    whatever ``overwrite`` (``--overwrite``) says: the tool would replace the whole run with one model. Only
    ``ode-train --overwrite_output_dir`` starts a run's folder afresh. ``suffix`` makes the example of another
    folder.

    Raises:
        FileExistsError: the folder, what it holds and how to write elsewhere.
    """
    refuse_replacing_inputs(folder, inputs, option, suffix)
    if found := run_contents(folder):
        listing = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        change = "--overwrite does not change that; " if overwrite else ""
        raise FileExistsError(
            f"{option} {folder} holds a training run ({listing}): writing the folder would delete its "
            f"checkpoints and results; {change}give another {option}, a new folder (e.g. "
            f"{real_path(folder)}-{suffix})"
        )


def refuse_replacing_output(
    folder: str | Path, inputs: Sequence[str | Path | None], option: str, overwrite: bool, suffix: str
) -> None:
    """The checks of a tool that writes a whole folder of one model (averaging, upcycling): never a folder that
    holds its inputs or a run (:func:`refuse_replacing_a_run`), and a non-empty one only with ``--overwrite``
    (:func:`ode_transformer.files.refuse_occupied`)."""
    refuse_replacing_a_run(folder, inputs, option, overwrite, suffix=suffix)
    refuse_occupied(folder, overwrite, "--overwrite", option)


@contextmanager
def writing_output_folder(
    folder: str | Path, inputs: Sequence[str | Path | None], option: str, overwrite: bool, suffix: str
) -> Iterator[Path]:
    """The staging folder of ``folder`` (:func:`ode_transformer.files.staged_folder`: renamed into place whole
    when the block ends), written under the folder's lock (:func:`ode_transformer.files.lock_output`: one
    writer by any of its names), with :func:`refuse_replacing_output`'s checks made again under that lock, now
    that no other writer can fill the folder or start a run in it. The caller makes them first too, before its
    costly work."""
    with lock_output(folder, option):
        refuse_replacing_output(folder, inputs, option, overwrite, suffix)
        with staged_folder(folder) as staged:
            yield staged


@contextmanager
def lock_output_dir(output_dir: str | Path) -> Iterator[None]:
    """Hold ``OUTPUT_DIR/.run.lock`` (:func:`ode_transformer.files.hold_lock`, which says that the folder holds a
    run), then the folder's lock beside it (``.NAME.lock``, :func:`ode_transformer.files.lock_output`, which
    every writer of a whole folder takes: an export, averaging, a conversion), while the block runs: one writer
    per folder, also for two started at once (a check of the folder's contents alone lets both through). The
    folder is created if needed; the lock files are removed at the end, and the folder too if the run wrote
    nothing into it.

    Raises:
        InUseError: another process holds either lock (its pid named).
    """
    folder = Path(output_dir)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    real = real_path(folder)  # the lock of the folder, whatever its name
    try:
        with (
            hold_lock(folder, real / LOCK_FILE, real / PID_FILE, "--output_dir", holder="run"),
            _lock_beside(folder),
        ):
            yield
    finally:
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


@contextmanager
def _lock_beside(folder: Path) -> Iterator[None]:
    """:func:`ode_transformer.files.lock_output` of ``folder``; nothing where its parent cannot hold a lock file
    (read-only, or another user's): no writer of the whole folder can stage it there either."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(lock_output(folder, "--output_dir"))
        except OSError as error:
            if isinstance(error, InUseError) or error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
        yield


# What the trainer unpickles when it resumes (with torch.load(weights_only=True) and transformers' allowed
# globals); training_args.bin is not read back.
_RESUMED_PICKLES = ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state*.pth")


def check_checkpoint_pickles(checkpoint: str | Path) -> None:
    """Refuse, before anything else happens, a checkpoint whose files the resumed run could not use: a pickle file
    holding more than tensors and plain values, in any of torch's formats (zip, the legacy non-zip one, or a raw
    pickle), which torch's UnpicklingError would stop at the first step (never running it), or a cut-off or damaged
    ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth`` or ``model.safetensors``, which stopped the run with
    ``[Errno 22] Invalid argument`` or ``incomplete metadata``, the file not named. The pickles are read with
    ``torch.load(weights_only=True)`` (zip files with ``mmap``: the tensors' data stays on the disk); the weights'
    header is checked against the file's size.

    Raises:
        ValueError: the file named, with what is wrong and the fix.
    """
    import pickle
    import zipfile

    import torch
    from transformers.trainer_pt_utils import safe_globals

    from modeling_ode.weights_integrity import check_safetensors_file, non_finite_message

    folder = Path(checkpoint)
    fix = (
        "resume from another checkpoint (its folder as --resume_from_checkpoint), or start the run again "
        "with --overwrite_output_dir true"
    )
    if (folder / WEIGHTS).is_file():
        try:
            check_safetensors_file(folder / WEIGHTS)
        except OSError as error:
            raise ValueError(f"{str(error).split('; ')[0]}; {fix}") from None
        if bad := _non_finite_weights(folder / WEIGHTS):
            raise ValueError(
                f"{non_finite_message(folder / WEIGHTS, bad)}: the run had diverged before this checkpoint was "
                f"saved, and training cannot recover them; {fix.replace('another', 'an earlier')}"
            )
    for path in sorted(p for pattern in _RESUMED_PICKLES for p in folder.glob(pattern)):
        try:
            with safe_globals():
                torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
        except pickle.UnpicklingError as error:
            if "GLOBAL" in str(error) or "Unsupported" in str(error):
                raise ValueError(unsafe_pickle_message(path, error, fix)) from None
            raise ValueError(_damaged(path, error, fix)) from None
        except Exception as error:  # a cut-off zip, an empty file, bytes of something else
            raise ValueError(_damaged(path, error, fix)) from None


def _non_finite_weights(weights: Path) -> list[str]:
    """The tensors of a safetensors file that hold NaN or infinity, read one at a time."""
    import torch
    from safetensors import safe_open

    bad = []
    with safe_open(str(weights), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 (a safe_open handle is no dict)
            tensor = f.get_tensor(key)
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                bad.append(key)
    return bad


def _damaged(path: Path, error: Exception, fix: str) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = lines[0].split(". ")[0] if lines else type(error).__name__
    return f"{path} cannot be read ({reason}): it is cut off or damaged (an interrupted copy or save); {fix}"


def unsafe_pickle_message(path: str | Path, error: Exception, fix: str) -> str:
    """What a pickle file refused by ``torch.load(weights_only=True)`` holds, and ``fix``."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = next(
        (line for line in lines if "GLOBAL" in line or line.startswith("Unsupported")),
        lines[-1] if lines else "",
    )
    return (
        f"{path} holds objects other than tensors and plain values ({reason}): it is not loaded, since unpickling "
        f"it could run code; {fix}"
    )
