"""What a result records about where it was made: the code's git commit and the device. One home for the
studies (``experiments.run``) and the demo (``ode_transformer.train.demo``)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def git_commit(repo: Path = REPO) -> dict[str, Any]:
    """The checkout's commit and whether tracked files differ from it; ``commit`` None outside a git checkout
    (an installed package: its version says what it is)."""
    if not (repo / ".git").exists():
        return {"commit": None, "dirty": None}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True).stdout.strip()

    try:
        return {
            "commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
    except OSError:  # no git program
        return {"commit": None, "dirty": None}


def device_info(device: str, threads: int) -> dict[str, Any]:
    """The device (``cpu``: the processor's name and core count; CUDA: the GPU's name), the intra-op threads
    and the torch and Python versions."""
    import torch

    info = {
        "device": device,
        "threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if device == "cpu":
        cpu = next(
            (line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")),
            platform.processor(),
        )
        info.update(name=cpu, cores=os.cpu_count(), capability=torch.backends.cpu.get_cpu_capability())
    elif torch.cuda.is_available():
        info.update(name=torch.cuda.get_device_name(0))
    return info


def _cpuinfo() -> list[str]:
    path = Path("/proc/cpuinfo")
    return path.read_text().splitlines() if path.is_file() else []
