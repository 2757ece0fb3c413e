"""The console commands of ``pyproject.toml`` (``ode-train``, ``ode-translate``, ...).

Each runs a module's ``main``; a third-party module missing because an extra was not installed ends the
command with one line naming the extra to install, not a traceback.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

OWN_PACKAGES = ("ode_transformer", "modeling_ode", "train", "hub")


def _launch(module: str, extra: str | None) -> None:
    try:
        importlib.import_module(f"ode_transformer.{module}").main()
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        if extra is None or not missing or missing in OWN_PACKAGES:
            raise
        command = Path(sys.argv[0]).name
        sys.exit(
            f"{command}: needs the {missing!r} package: install `ode-transformer[{extra}]` "
            f"(pip install 'ode-transformer[{extra}]')"
        )


def train() -> None:
    _launch("train.run", "train")


def translate() -> None:
    _launch("train.translate", None)  # the core install suffices


def evaluate() -> None:
    _launch("train.evaluate_predictions", "train")


def export() -> None:
    _launch("hub.export", "hub")


def model_card() -> None:
    _launch("hub.model_card", "hub")


def push() -> None:
    _launch("hub.push", "hub")
