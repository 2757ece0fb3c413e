"""The README runs as written, and its figures are those of the files it cites."""

import json
import math
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_quickstart_runs():
    block = re.search(r"## Quickstart\n\n```python\n(.*?)```", README.read_text(), re.DOTALL).group(1)
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    out, config = namespace["out"], namespace["config"]
    assert out.shape[0] == 2 and 2 <= out.shape[1] <= 1 + 20  # decoder start + at most max_new_tokens
    assert (out[:, 0] == config.decoder_start_token_id).all()
    # an untrained model is close to uniform over the vocabulary: its loss is about log V (label smoothing and
    # random logits add a little), not merely positive
    assert abs(namespace["loss"].item() - math.log(config.vocab_size)) < 1.5


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


def _first_table(text: str) -> list[str]:
    """The lines of the first Markdown table in ``text``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_readme_result_tables_are_the_result_files_tables():
    """Each results table in the README is the one `experiments.report` wrote from the result files it cites
    (the first table after "table: `results/<study>/<size>/README.md`"), and the pilot's figures quoted under it
    are those of its `summary.json` (the mean over seeds of each variant)."""
    text = README.read_text()
    cited = re.findall(r"table: `(results/[\w.]+/\w+)/README\.md`", text)
    # every study with results has its table in the README (an edit once dropped two sections unnoticed)
    reported = sorted(
        str(path.parent.relative_to(README.parent)) for path in README.parent.glob("results/*/*/README.md")
    )
    assert sorted(cited) == reported
    for folder in cited:
        ours = _first_table(text[text.index(f"table: `{folder}/README.md`") :])
        assert ours == _first_table((README.parent / folder / "README.md").read_text()), folder
    folder = README.parent / "results" / "ptb_pilot" / "cpu"
    means = {
        row["variant"]: row["Word perplexity"]["mean"]
        for row in json.loads((folder / "summary.json").read_text())
    }
    quoted = re.search(
        r"residual ([\d.]+) \(the issue's pilot: [\d.]+\), RK4\s+([\d.]+) \([\d.]+\), RK2-gated ([\d.]+)",
        README.read_text(),
    )
    assert [float(x) for x in quoted.groups()] == [
        round(means[v], 1) for v in ("residual.pilot", "rk4.pilot", "rk2_gated.pilot")
    ]
