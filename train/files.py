"""Files and folders for every command: reading text files (plain or gzip), claiming an output folder, and
naming a full disk, with only the standard library (``hub`` uses these too)."""

from __future__ import annotations

import codecs
import errno
import gzip
import logging
import shutil
import sys
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["clear_folder", "read_byte_lines", "read_lines", "refuse_occupied", "saving"]

logger = logging.getLogger(__name__)

# How a full disk or a file-size limit shows: OSError errnos, and the messages of safetensors (Rust io errors)
# and of torch.save (its zip writer), which raise other exception types.
_NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
_NO_SPACE_MESSAGES = ("os error 28", "os error 27", "os error 122", "No space left", "File too large",
                      "file write failed", "unexpected pos")  # fmt: skip


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
