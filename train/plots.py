"""Loss curves of a training run, drawn from ``trainer.state.log_history``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after selecting the headless backend)

from ode_transformer.files import replacing  # noqa: E402

__all__ = ["loss_series", "plot_loss_curves"]


def loss_series(log_history: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of ``key`` (``loss``, ``eval_loss``) in the trainer's log history."""
    points = [(entry["step"], float(entry[key])) for entry in log_history if key in entry and "step" in entry]
    return [step for step, _ in points], [value for _, value in points]


def plot_loss_curves(log_history: Sequence[dict], path: str | Path, title: str = "ODE Transformer") -> Path:
    """Write a PNG with the training loss and, when logged, the validation loss per step."""
    figure, axis = plt.subplots(figsize=(7, 4), dpi=100)
    for key, label in (("loss", "training loss"), ("eval_loss", "validation loss")):
        steps, values = loss_series(log_history, key)
        if steps:
            axis.plot(steps, values, marker="o" if len(steps) < 30 else None, label=label)
    axis.set_xlabel("update step")
    axis.set_ylabel("loss (label-smoothed for training)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend()
    figure.tight_layout()
    path = Path(path)
    with replacing(path) as temporary:  # whole or not at all (savefig reads the format from the suffix)
        figure.savefig(temporary)
    plt.close(figure)
    return path
