"""Words shared by the training summary and the model card."""

from __future__ import annotations


def counted(number: int, noun: str) -> str:
    """``1 layer``, ``3 layers``: a count with its noun in the right number."""
    return f"{number} {noun}" + ("" if number == 1 else "s")
