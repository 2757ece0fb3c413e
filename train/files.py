"""Reading text files (plain or gzip) with only the standard library, for every command that reads lines."""

from __future__ import annotations

import gzip
from pathlib import Path

__all__ = ["read_lines"]


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file (gzip-compressed if the name ends in ``.gz``), without newlines."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    data = gzip.decompress(file.read_bytes()) if file.suffix == ".gz" else file.read_bytes()
    lines = data.decode("utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]
