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


def _config_table_row(field: str) -> str:
    """The 'values' cell of the README's config table row that starts with `field`."""
    row = next(line for line in README.read_text().splitlines() if line.startswith(f"| `{field}`"))
    return row.split("|")[2]


def test_readme_config_table_lists_exactly_the_catalogue():
    """The README's choices are those of the catalogue in modeling_ode/ode.py (the config validates against it)."""
    from modeling_ode.ode import (
        COEFFICIENT_MODES,
        COEFFICIENT_SCOPES,
        EMA_ALPHA_SIZES,
        LAYER_CONNECTIONS,
        ODE_FUNCTIONS,
        ODE_METHODS,
    )

    for field, table in [
        ("encoder_ode_method", ODE_METHODS),
        ("encoder_ode_coefficients", COEFFICIENT_MODES),
        ("encoder_ode_function", ODE_FUNCTIONS),
        ("ode_coefficient_scope", COEFFICIENT_SCOPES),
        ("ode_ema_alpha", EMA_ALPHA_SIZES),
        ("encoder_layer_connections", LAYER_CONNECTIONS),
    ]:
        names = re.findall(r"`(\w+)`", _config_table_row(field))
        assert sorted(names) == sorted(table), field
