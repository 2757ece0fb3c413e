"""The README's quickstart runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_quickstart_runs():
    block = re.search(r"## Quickstart\n\n```python\n(.*?)```", README.read_text(), re.DOTALL).group(1)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["out"].shape[0] == 2
    assert namespace["loss"].item() > 0


def test_readme_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    commands = [line.split("#")[0].strip() for line in lines[:6] if line.startswith("make ")]
    assert commands == ["make demo", "make test"]
