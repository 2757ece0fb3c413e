"""Every notebook executes top to bottom in a Jupyter kernel (nbclient) on its smoke parameterisation
(``ODE_NOTEBOOK_SMOKE=1``: a few training steps). The notebooks assert their own results: reloaded
models translate identically, order-of-accuracy slopes match the tableaus, recomputed gates equal the
recorded ones, tables equal the means of the raw result files."""

import os
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
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


def test_notebooks_are_committed_with_outputs():
    """What a reader opens on the Hub or GitHub shows a real run: every code cell has been executed."""
    for path in NOTEBOOKS:
        cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        assert all(c.execution_count for c in cells), f"{path.name}: run it and save its outputs"
