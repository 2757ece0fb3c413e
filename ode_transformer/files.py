"""Files and folders for every command: reading text files (plain or gzip), locking an output folder or file
(one writer at a time), writing a file or folder whole or not at all, and naming a full disk (``hub`` uses these
too). Only the standard library and ``filelock``.

A file is written to a temporary name in its folder and renamed over the target once complete
(:func:`replacing`, :func:`write_atomic`): a rename within a folder is atomic, so a kill, a full disk or Ctrl-C
leaves either the old file or the new one, never a cut-off mix. A folder is written as ``NAME.incomplete`` beside
it and renamed into place the same way (:func:`staged_folder`).
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import errno
import gzip
import logging
import os
import shutil
import sys
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

__all__ = [
    "InUseError",
    "hold_lock",
    "lock_output",
    "clear_folder",
    "match_umask",
    "read_byte_lines",
    "read_lines",
    "real_path",
    "refuse_occupied",
    "refuse_replacing_inputs",
    "replace_folder",
    "replacing",
    "saving",
    "staged_folder",
    "write_atomic",
]

logger = logging.getLogger(__name__)

# How a full disk or a file-size limit shows: OSError errnos, and the messages of safetensors (Rust io errors)
# and of torch.save (its zip writer), which raise other exception types.
_NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
# torch.save's zip writer: "unexpected pos" when a record's write fails, "basic_ios::clear: iostream error" when its
# final flush (the archive's directory) does. (A protobuf that does not parse is no sign of a full disk, except
# where the graph just read is copied and read back: ode_transformer.hub.onnx_export.quantize_graph_int8.)
_NO_SPACE_MESSAGES = (
    "os error 28",
    "os error 27",
    "os error 122",
    "No space left",
    "File too large",
    "file write failed",
    "unexpected pos",
    "basic_ios::clear",
)
INCOMPLETE = ".incomplete"
"""Suffix of a folder being written (:func:`staged_folder`): renamed to its name once complete."""
_PID_WAIT_SECONDS = 5.0  # a lock's holder writes its pid right after taking the lock


def read_byte_lines(path: str | Path) -> list[bytes]:
    """Lines of a file (gzip-compressed if the name ends in ``.gz``) as bytes, without ``\\n``, a final ``\\r`` or
    a leading UTF-8 byte-order mark.

    The final newline ends the last line, it does not start a new one.

    A pipe or device (``/dev/stdin``, ``<(zcat x.gz)``) reads like a file; ``-`` is standard input.

    Raises:
        FileNotFoundError: no such file.
        IsADirectoryError: a folder.
        ValueError: a ``.gz`` file is truncated or damaged, the text is UTF-16, or it ends its lines with a bare
            ``\\r`` (the file named).
    """
    if str(path) == "-":
        stdin = getattr(sys.stdin, "buffer", None)  # a replaced sys.stdin (io.StringIO) has none
        return _split_lines(
            stdin.read() if stdin is not None else sys.stdin.read().encode("utf-8"), "standard input"
        )
    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if file.is_dir():
        raise IsADirectoryError(f"{path} is a folder: give a text file, one line per example")
    data = file.read_bytes()
    if file.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as error:  # EOFError: cut off; BadGzipFile (OSError): not gzip
            raise ValueError(
                f"{path} is a truncated or damaged gzip file ({error}); copy or compress it again"
            ) from None
    return _split_lines(data, str(path))


def _split_lines(data: bytes, name: str) -> list[bytes]:
    # Either would be read as one line of garbage, or as one line holding the whole file: refused, not guessed.
    head = data[:4096]  # UTF-16 text: a UTF-16 byte-order mark, or a NUL beside most ASCII letters
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or head.count(b"\x00") > len(head) // 4:
        raise ValueError(
            f"{name} looks like UTF-16 text (Windows' 'Unicode'): convert it to UTF-8 (e.g. iconv -f utf-16 -t utf-8)"
        )
    if b"\n" not in data and b"\r" in data.rstrip(b"\r"):
        raise ValueError(
            f"{name} ends its lines with a bare carriage return (\\r); convert them: tr '\\r' '\\n'"
        )
    # A byte-order mark (Windows editors write one) is not text: left in, it becomes tokens of the first line.
    lines = data.removeprefix(codecs.BOM_UTF8).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (gzip-compressed if the name ends in ``.gz``), see :func:`read_byte_lines`.

    Raises:
        ValueError: a line is not valid UTF-8 (the file and line named).
    """
    texts = []
    for number, line in enumerate(read_byte_lines(path), start=1):
        try:
            texts.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise ValueError(
                f"{'standard input' if str(path) == '-' else path}, line {number}: not UTF-8 text; convert the "
                "file (e.g. iconv -f latin1 -t utf-8)"
            ) from None
    return texts


def _contents(folder: Path, ignore: Iterable[str]) -> list[Path]:
    skip = set(ignore)
    return sorted(p for p in folder.iterdir() if p.name not in skip) if folder.is_dir() else []


def refuse_occupied(
    folder: str | Path,
    overwrite: bool,
    flag: str,
    option: str,
    what: str = "files",
    advice: str = "",
    ignore: Iterable[str] = (),
) -> None:
    """Refuse to write into a non-empty ``folder`` unless ``overwrite``: its files would be replaced or, left
    beside the new ones, describe another model. The error names the folder, a few of its files and the fixes
    (``advice``, then ``flag``, then an empty ``option``). Names in ``ignore`` (lock files) do not count.

    Raises:
        FileExistsError: ``folder`` holds files and ``overwrite`` is false.
    """
    contents = _contents(Path(folder), ignore)
    if contents and not overwrite:
        names = ", ".join(p.name for p in contents[:5])
        raise FileExistsError(
            f"{folder} already holds {what} ({names}, ...); {advice}pass {flag} to delete it first, "
            f"or choose an empty {option}."
        )


def refuse_replacing_inputs(
    folder: str | Path, inputs: Iterable[str | Path | None], option: str, suffix: str = "new"
) -> None:
    """Refuse to write the folder ``folder`` (``option`` names its flag) where it is, or holds, one of the command's
    own ``inputs`` (``None`` entries skipped), whatever ``--overwrite`` says: replacing the folder would delete
    them (``ode-export RUN/checkpoint-40 RUN --overwrite`` deleted the run it exported from). Compared by
    :func:`real_path`, so that no other name of the folder passes; ``suffix`` makes the example of another folder.

    Raises:
        FileExistsError: the input, the folder and how to write elsewhere.
    """
    out = real_path(folder)
    for name in filter(None, inputs):
        path = real_path(name)
        if path.exists() and (path == out or out in path.parents):
            where = "is" if path == out else "holds"
            raise FileExistsError(
                f"{option} {folder} {where} {name}, an input of this command: writing the folder would delete it, "
                f"whatever --overwrite says; give another {option}, a new folder outside it (e.g. {out}-{suffix})"
            )


def clear_folder(folder: str | Path, keep: Iterable[str] = ()) -> None:
    """Delete what ``folder`` holds (an ``--overwrite``), except the names in ``keep`` (a held lock file)."""
    contents = _contents(Path(folder), keep)
    if contents:
        logger.warning("overwriting: deleting the contents of %s", folder)
    for path in contents:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _out_of_space(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno in _NO_SPACE_ERRNOS:
        return True
    return any(message in str(error) for message in _NO_SPACE_MESSAGES)


@contextmanager
def saving(path: str | Path) -> Iterator[None]:
    """Around a save: a full disk or a file-size limit, whatever library hit it (safetensors, torch.save, json),
    becomes one line naming ``path`` instead of a long trace from inside that library.

    Raises:
        OSError: (``ENOSPC``) "no space left on device while saving PATH".
    """
    try:
        yield
    except Exception as error:
        if not _out_of_space(error):
            raise
        raise OSError(
            errno.ENOSPC,
            f"no space left on device while saving {path} ({str(error).splitlines()[0][:200]}); free some space "
            "(or raise the file-size limit, `ulimit -f`) and run the command again",
        ) from None


def real_path(path: str | Path) -> Path:
    """``path`` with every symbolic link in it followed (to the end, also where the last one points to nothing yet)
    and ``..`` resolved: the one name of a file or folder, whatever name a command was given. Every lock and
    staging name derives from it, so that two writers of one output by two names (``runs/E9`` and a link to it)
    take the same lock; and an output that is a link is written through to its target, never replaced by a
    regular file."""
    return Path(os.path.realpath(path))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def match_umask(path: str | Path) -> None:
    """Give ``path`` (a file, or a folder and everything in it) the modes ``open()`` and ``mkdir`` give under the
    umask (0644 and 0755 under the usual 022): some writers (safetensors, ``tempfile``) create their files 0600,
    which other users then cannot read while every other file of the folder is readable."""
    mask = _umask()
    root = Path(path)
    paths = [root, *root.rglob("*")] if root.is_dir() and not root.is_symlink() else [root]
    for item in paths:
        if item.is_symlink():
            continue
        wanted = (0o777 if item.is_dir() else 0o666) & ~mask
        if item.is_file() and item.stat().st_mode & 0o111:
            wanted = 0o777 & ~mask  # an executable stays executable
        if item.stat().st_mode & 0o777 != wanted:
            item.chmod(wanted)


@contextmanager
def replacing(path: str | Path, keep_suffix: bool = True) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that takes a path; renamed over ``path`` when the block ends
    without an error, deleted otherwise. With ``keep_suffix`` it ends as ``path`` does (savefig reads the format
    from it); without, it ends in ``.tmp``, so that a glob of ``path``'s kind (``*.json``) never finds one that a
    kill left behind. A full disk is named (:func:`saving`). A ``path`` that is a symbolic link is written
    through to its target (the link stays); the file gets the umask's mode whatever mode its writer gave it
    (:func:`match_umask`)."""
    target = real_path(path)
    tag = uuid.uuid4().hex[:8]
    name = f".{target.stem}.{tag}.tmp{target.suffix}" if keep_suffix else f".{target.name}.{tag}.tmp"
    temporary = target.with_name(name)
    try:
        with saving(target):
            yield temporary
            match_umask(temporary)
            os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def write_atomic(path: str | Path, data: str | bytes, encoding: str = "utf-8") -> None:
    """Write ``data`` to ``path`` whole or not at all (:func:`replacing`); an old ``path`` stays as it was until
    the new one is complete. Flushed to the disk before the rename, so a crash after it cannot leave it empty."""
    with replacing(path, keep_suffix=False) as temporary:
        # 0o666 less the umask, as open() creates files (tempfile would give 0o600)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as file:
            file.write(data.encode(encoding) if isinstance(data, str) else data)
            file.flush()
            os.fsync(file.fileno())


_RENAME_EXCHANGE = 2  # renameat2's flag (Linux 3.15+): swap two paths in one step


def _exchange(first: Path, second: Path) -> bool:
    """Swap the folders ``first`` and ``second`` in one rename (``renameat2(RENAME_EXCHANGE)``); False where the
    system or file system has no such rename (then nothing happened)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not Linux, or a C library without it
        return False
    at_cwd = -100
    if renameat2(at_cwd, os.fsencode(first), at_cwd, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, f"{os.strerror(code)}: swapping {first} and {second}")


def replace_folder(staged: Path, final: Path) -> None:
    """Move the fully written folder ``staged`` to ``final``, replacing an existing ``final`` in one rename that
    swaps the two (Linux); ``staged`` then holds the old folder, which is deleted. So ``final`` is the complete
    old folder or the complete new one at every moment, and a kill leaves one of them in place (the old one
    parked in ``staged``, which the next write removes). Where that rename does not exist, the old folder is
    moved aside to ``STAGED.old`` first (a moment without ``final``). The new files get the umask's modes
    (:func:`match_umask`).

    A reader that loads files of ``final`` one by one (``from_pretrained``) while it is replaced can still take
    one from each: an export records a digest of its weights in its config files, which the model's
    ``from_pretrained`` checks (README, "Safety and recovery")."""
    match_umask(staged)
    if not final.exists():
        staged.rename(final)
    elif _exchange(staged, final):
        shutil.rmtree(staged)
    else:
        old = staged.with_name(staged.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        staged.rename(final)
        shutil.rmtree(old)


@contextmanager
def staged_folder(folder: str | Path) -> Iterator[Path]:
    """``FOLDER.incomplete`` to write a folder into; renamed to ``folder`` (replacing it) when the block ends
    without an error (:func:`replace_folder`: one rename that swaps an existing ``folder`` out). A kill leaves
    ``folder`` whole, old or new, and the staging folder (holding the new files, or the old ones swapped out),
    which the next write names and deletes (hold :func:`lock_output` around this: a second writer's staging folder is not stale)."""
    final = real_path(folder)
    staged = final.with_name(final.name + INCOMPLETE)
    for left in (staged, staged.with_name(staged.name + ".old")):  # .old: an old folder set aside
        if left.exists():
            logger.warning("removing %s: left by an interrupted write of %s", left, final)
            shutil.rmtree(left)
    staged.mkdir(parents=True)
    try:
        with saving(folder):  # a full disk names the folder asked for, not its staging name
            yield staged
        if final.is_dir() and any(final.iterdir()):
            logger.warning("overwriting %s", final)
        replace_folder(staged, final)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)  # not a kill: nothing to mark
        raise


class InUseError(BlockingIOError):
    """Another process writes the same output (a second writer is refused, never silently the last one)."""


def _holder_pid(pid_file: Path) -> str:
    """The pid the holder of a lock wrote (it does so just after taking the lock)."""
    deadline = time.monotonic() + _PID_WAIT_SECONDS
    while True:
        try:
            pid = pid_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            pid = ""
        if pid or time.monotonic() > deadline:
            return pid or "unknown"
        time.sleep(0.01)


@contextmanager
def hold_lock(
    target: str | Path, lock_file: Path, pid_file: Path, option: str, holder: str = "process"
) -> Iterator[None]:
    """Hold ``lock_file`` while the block runs, with this process's pid in ``pid_file``: one writer of ``target``
    at a time, also for two started at the same moment. Both files are removed at the end (while held: a
    process waiting on the old file sees it unlinked and retries; filelock checks the inode). A lock left by a
    killed process is free (the kernel releases it with the process).

    Raises:
        InUseError: another process holds the lock (its pid and ``option``, the flag to change, named).
    """
    lock = FileLock(lock_file, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise InUseError(
            f"{target} is in use by another {holder} (pid {_holder_pid(pid_file)}); wait for it to finish or stop "
            f"it, or choose another {option}."
        ) from None
    try:
        with saving(target):  # a full disk is named here too, not as a bare [Errno 28] of the pid file
            pid_file.write_text(f"{os.getpid()}\n", encoding="utf-8")
        yield
    finally:
        for path in (pid_file, lock_file):
            path.unlink(missing_ok=True)
        lock.release()


def lock_output(path: str | Path, option: str) -> contextlib.AbstractContextManager[None]:
    """:func:`hold_lock` for an output file or folder ``path``: ``.NAME.lock`` and ``.NAME.pid`` beside it (its
    folder is created if needed), NAME being that of its :func:`real_path`, so that every name of one output
    takes one lock."""
    real = real_path(path)
    real.parent.mkdir(parents=True, exist_ok=True)
    return hold_lock(path, real.with_name(f".{real.name}.lock"), real.with_name(f".{real.name}.pid"), option)
