"""Reading text files (plain or gzip) with only the standard library, for every command that reads lines."""

from __future__ import annotations

import gzip
from pathlib import Path

__all__ = ["read_byte_lines", "read_lines"]


def read_byte_lines(path: str | Path) -> list[bytes]:
    """Lines of a file (gzip-compressed if the name ends in ``.gz``) as bytes, without ``\\n`` or a final ``\\r``.

    The final newline ends the last line, it does not start a new one.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    data = gzip.decompress(file.read_bytes()) if file.suffix == ".gz" else file.read_bytes()
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (gzip-compressed if the name ends in ``.gz``), see :func:`read_byte_lines`.

    Raises:
        UnicodeDecodeError: a line is not valid UTF-8.
    """
    return [line.decode("utf-8") for line in read_byte_lines(path)]
