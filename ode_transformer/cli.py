"""The console commands of ``pyproject.toml`` (``ode-train``, ``ode-translate``, ...).

Each runs a module's ``main``. What a user can fix ends the command with one line on stderr and exit code 2,
not a traceback: a third-party module missing because an extra was not installed (the extra named), and the
``OSError`` / ``ValueError`` our tools raise for bad input (a missing file, a damaged ``.gz``, a full disk, ...),
whose messages name the problem and the fix. ``ODE_TRACEBACK=1`` shows the traceback instead.
(``python -m train.translate`` and the other modules keep Python's traceback: that is the developer's path.)
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

OWN_PACKAGES = ("ode_transformer", "modeling_ode", "train", "hub")


def _launch(module: str, extra: str | None) -> None:
    command = Path(sys.argv[0]).name
    try:
        main = importlib.import_module(f"ode_transformer.{module}").main
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        if extra is None or not missing or missing in OWN_PACKAGES:
            raise
        sys.exit(
            f"{command}: needs the {missing!r} package: install `ode-transformer[{extra}]` "
            f"(pip install 'ode-transformer[{extra}]')"
        )
    try:
        status = main()
    except (OSError, ValueError) as error:
        if os.environ.get("ODE_TRACEBACK"):
            raise
        print(f"{command}: error: {error} (ODE_TRACEBACK=1 shows where)", file=sys.stderr)
        sys.exit(2)
    sys.exit(status or 0)


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
