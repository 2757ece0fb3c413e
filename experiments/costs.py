"""What one run of a study's row costs on one kind of machine, from what has run there: the one rule the GPU
lease's plan (experiments/lease.py) and the CPU plan (experiments/verdict.py, results/verdict.md) both follow."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

Row = tuple[str, str]  # (study, variant)


@dataclass
class Costs:
    """Seconds per run of each row on one place (a GPU's name, or a CPU kind at a thread count): the median wall
    time of the row's runs that finished there uninterrupted, or, where none did, the median seconds per update of
    its runs stopped there times the median updates of the row's finished runs anywhere. A resumed run's wall time
    misses its earlier attempts, so it counts only for its updates."""

    seconds: dict[Row, list[float]] = field(default_factory=dict)
    rates: dict[Row, list[float]] = field(default_factory=dict)  # seconds per update of the runs stopped here
    steps: dict[Row, list[int]] = field(default_factory=dict)
    epochs: dict[Row, list[float]] = field(default_factory=dict)

    def add_result(self, result: dict[str, Any], here: bool) -> None:
        """A finished run's record; ``here``: it ran on this place."""
        row = (result["study"], result["variant"])
        self.steps.setdefault(row, []).append(result["steps"])
        if result.get("epochs"):
            self.epochs.setdefault(row, []).append(result["epochs"])
        if here and not result.get("resumed") and result.get("wall_time_s"):
            self.seconds.setdefault(row, []).append(result["wall_time_s"])

    def add_stopped(self, row: Row, seconds: float, steps: int) -> None:
        """A run stopped here after ``steps`` updates in ``seconds`` (a lease's deadline, a session's end)."""
        self.rates.setdefault(row, []).append(seconds / steps)

    def estimate(self, row: Row) -> float | None:
        """Seconds per run of ``row`` here (None: nothing measured here, or no finished run says how many updates
        a run takes)."""
        if row in self.seconds:
            return statistics.median(self.seconds[row])
        if row in self.rates and row in self.steps:
            return statistics.median(self.rates[row]) * statistics.median(self.steps[row])
        return None

    def per_epoch(self, row: Row) -> float | None:
        """Seconds per epoch of ``row`` here: a run's estimate over the epochs of the row's finished runs."""
        estimate = self.estimate(row)
        if estimate is None or row not in self.epochs:
            return None
        return estimate / statistics.median(self.epochs[row])
