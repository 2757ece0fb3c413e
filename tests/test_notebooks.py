"""Every notebook executes top to bottom in a Jupyter kernel (nbclient) on its smoke parameterisation
(``ODE_NOTEBOOK_SMOKE=1``: a few training steps). The notebooks assert their own results: reloaded
models translate identically, order-of-accuracy slopes match the tableaus, recomputed gates equal the
recorded ones, tables equal the means of the raw result files."""

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, shared_data, monkeypatch):
    monkeypatch.setenv("ODE_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("ODE_DATA_DIR", str(shared_data))
    # one torch thread in the kernel: beside the suite's other worker, two oversubscribe two cores
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    errors = [
        o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors


def test_notebooks_are_committed_with_outputs():
    """What a reader opens on the Hub or GitHub shows a real run: every code cell has been executed."""
    for path in NOTEBOOKS:
        cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        assert all(c.execution_count for c in cells), f"{path.name}: run it and save its outputs"


def _printed(name: str) -> str:
    """Everything a committed notebook printed or displayed as text (stdout, text/plain, text/markdown)."""
    notebook = nbformat.read(REPO / "notebooks" / name, as_version=4)
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            data = output.get("data", {})
            parts += [data.get("text/markdown", ""), data.get("text/plain", "")]
    return "\n".join(parts)


def test_committed_ode_blocks_outputs_show_the_orders_and_the_gate_parameters():
    """The error of one step falls as h^(order + 1) for every method shown; an RK2 gate costs 2d + 1 parameters per
    encoder block of the base model (6 blocks, d = 512); nothing failed."""
    from modeling_ode import ODE_METHODS

    text = _printed("ode_blocks.ipynb")
    slopes = dict(
        re.findall(r"^(\w+)\s+error\(h=0\.2\)=\S+\s+error\(h=0\.1\)=\S+\s+slope=([\d.]+)", text, re.M)
    )
    assert set(slopes) == {"euler", "rk2", "rk4"}
    for method, slope in slopes.items():
        assert abs(float(slope) - (ODE_METHODS[method].order + 1)) < 0.1, method
    counts = dict(re.findall(r"^(\w+)\s+\w+\s+([\d.]+)M parameters", text, re.M))
    assert float(counts["rk2"]) - float(counts["euler"]) == pytest.approx(6 * (2 * 512 + 1) / 1e6, abs=1.5e-3)
    assert counts["rk4"] == counts["euler"]  # stages share the block's weights
    assert "Traceback" not in text


def test_committed_quickstart_outputs_show_learning_and_an_identical_reload():
    text = _printed("quickstart.ipynb")
    losses = [
        float(x)
        for x in re.search(r"training loss \(label-smoothed\): \[([^\]]+)\]", text).group(1).split(",")
    ]
    assert len(losses) >= 2 and losses[-1] < losses[0]
    assert re.search(r"reloaded from \S+ - same translations", text)


def test_committed_truncation_error_notebook_shows_the_result_files_table():
    """The pilot table the notebook displays is the one `experiments.report` wrote from `results/`."""
    shown = _printed("truncation_error.ipynb")
    table = (REPO / "results" / "ptb_pilot" / "cpu" / "README.md").read_text(encoding="utf-8")
    rows = [line for line in table.splitlines() if line.startswith("| ") and "|---" not in line]
    assert rows and all(row in shown for row in rows)
