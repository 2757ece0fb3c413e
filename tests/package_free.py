"""Run Python code in a fresh interpreter where this repository's packages cannot be imported.

`python -I -S` skips the current directory, PYTHONPATH and the `site` module, so neither the repository nor
the `.pth` finder of an editable install of `ode-transformer` is on the import path; the installed
site-packages (torch, transformers, ...) are put back by hand. The code first checks that `modeling_ode`,
`train` and `hub` really are missing. Nothing reaches the Hub (`HF_HUB_OFFLINE=1`), and remote code is
cached under the working directory.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

PRELUDE = textwrap.dedent(
    """
    import importlib.util, sys
    sys.path.extend({paths!r})
    for name in ("modeling_ode", "train", "hub"):
        assert importlib.util.find_spec(name) is None, f"{{name}} is importable"
    """
)


def run_package_free(code: str, cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``code`` (with ``args`` in ``sys.argv[1:]``) in ``cwd``; the caller checks ``returncode``."""
    # the site directories, and those a `.pth` file chains in (a venv that borrows another's packages)
    chained = [p for p in sys.path if Path(p).name == "site-packages"]
    paths = [
        p
        for p in dict.fromkeys([*site.getsitepackages(), site.getusersitepackages(), *chained])
        if Path(p).is_dir()
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_"))}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(cwd / ".hf"),
        "HF_MODULES_CACHE": str(cwd / ".hf" / "modules"),
    }
    script = PRELUDE.format(paths=paths) + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
