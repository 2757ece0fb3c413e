"""ode-translate's --backend: onnx decodes the folder's graphs (of `ode-export --onnx`) into the PyTorch path's
outputs, auto picks the path of ode_transformer/translate.py's FASTEST table and falls back to PyTorch with the command that
writes the graphs, and a combination that cannot work is a parser error naming the fix.

One tiny random model (tests/tiny_folder.py) exported once to float32 and once to int8 graphs (TorchScript
exporter: seconds), in module-scoped folders."""

from __future__ import annotations

import logging
import shutil

import pytest
from tiny_folder import SOURCES, save_tiny_folder

from ode_transformer import translate

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{"model": the saved tiny folder, "fp32": its `ode-export --onnx` folder, "int8": with --quantize int8}."""
    from ode_transformer.hub.export import main as export

    root = tmp_path_factory.mktemp("backend")
    save_tiny_folder(root / "model", weight_scale=3)
    out = {"model": root / "model", "fp32": root / "fp32", "int8": root / "int8"}
    for name, extra in (("fp32", []), ("int8", ["--quantize", "int8"])):
        argv = [str(out["model"]), str(out[name]), "--onnx", "--onnx-exporter", "torchscript", *extra]
        assert export(argv) == 0
    return out


def run(folder, capsys, *flags: str, sources=SOURCES) -> list[str]:
    source = folder.parent / "sources.txt"
    source.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    translate.main([str(folder), "--input", str(source), "--no_progress", *flags])
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("beams", ["1", "3"])
def test_onnx_backend_writes_the_pytorch_backends_outputs(folders, capsys, beams):
    """Greedy and beam search, length-sorted batches of 2 (so that padding is exercised): the same lines, and not
    all the same line (a model that writes the same for every input would hide a mix-up of the inputs)."""
    flags = ("--batch_size", "2", "--num_beams", beams, "--max_new_tokens", "6")
    pytorch = run(folders["fp32"], capsys, "--backend", "pytorch", *flags)
    onnx = run(folders["fp32"], capsys, "--backend", "onnx", *flags)
    assert onnx == pytorch and len(pytorch) == len(SOURCES) and len(set(pytorch)) > 1


def test_onnx_backend_follows_max_length(folders, capsys):
    """`--max_length` (generate()'s: the decoder's start token included) caps the ONNX backend's outputs as it
    caps PyTorch's: the same lines, greedy and with beams."""
    for beams in ("1", "3"):
        flags = ("--batch_size", "2", "--num_beams", beams, "--max_length", "4")
        pytorch = run(folders["fp32"], capsys, "--backend", "pytorch", *flags)
        assert run(folders["fp32"], capsys, "--backend", "onnx", *flags) == pytorch
        assert len(pytorch) == len(SOURCES) and len(set(pytorch)) > 1


@pytest.mark.parametrize("beams", ["1", "3"])
def test_onnx_backend_decodes_with_the_search_graph(folders, capsys, monkeypatch, beams):
    """`ode-export --onnx` writes the search graph beside the three graphs, and --backend onnx decodes
    with it, one run of onnxruntime's BeamSearch op per batch: the PyTorch backend's lines."""
    from ode_transformer.onnx_search_decoding import ONNXSearchGenerator

    runs = []
    search = ONNXSearchGenerator.search
    monkeypatch.setattr(
        ONNXSearchGenerator, "search", lambda self, *args: runs.append(1) or search(self, *args)
    )
    flags = ("--batch_size", "2", "--num_beams", beams, "--max_new_tokens", "6")
    pytorch = run(folders["fp32"], capsys, "--backend", "pytorch", *flags)
    assert run(folders["fp32"], capsys, "--backend", "onnx", *flags) == pytorch
    assert len(runs) == -(-len(SOURCES) // 2)  # one per batch


def test_onnx_int8_backend_decodes_the_int8_graphs(folders, capsys):
    """--quantize int8 with --backend onnx reads the *_quantized.onnx graphs: one output per input, and the tiny
    model's int8 outputs agree with PyTorch int8's on most lines (both round the products)."""
    flags = ("--batch_size", "3", "--num_beams", "2", "--quantize", "int8")
    onnx = run(folders["int8"], capsys, "--backend", "onnx", *flags)
    pytorch = run(folders["int8"], capsys, "--backend", "pytorch", *flags)
    assert len(onnx) == len(SOURCES)
    assert sum(a == b for a, b in zip(onnx, pytorch)) >= len(SOURCES) - 2


def test_auto_picks_the_tables_backend_and_says_why(folders, capsys, caplog, monkeypatch):
    """auto decodes with the backend FASTEST names for the nearest measured setting, and logs one INFO line naming
    it (no warning: a choice, not a problem); the batch is the inputs per batch (6 inputs with --batch_size 32 are a
    batch of 6)."""
    monkeypatch.setattr(translate, "FASTEST", {(1, 1): {"float32": "onnx"}, (16, 4): {"float32": "pytorch"}})
    used = []
    for name in ("load_for_generation", "load_onnx_for_generation"):
        original = getattr(translate, name)
        monkeypatch.setattr(
            translate, name, lambda *a, _o=original, _n=name, **k: used.append(_n) or _o(*a, **k)
        )
    for beams, expected in (("1", "onnx"), ("4", "pytorch")):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="ode_transformer.translate"):
            outputs = run(folders["fp32"], capsys, "--num_beams", beams, "--max_new_tokens", "4")
        assert len(outputs) == len(SOURCES)
        records = [r for r in caplog.records if r.name == "ode_transformer.translate"]
        lines = [r.getMessage() for r in records]
        assert lines[1:] == [  # SOURCES' empty line, warned of
            "1 of 6 input line(s) are empty (line numbers 4): each gets an empty output line, not a translation"
        ]
        assert records[0].levelno == logging.INFO
        assert lines[0].startswith(f"backend {expected}: fastest in float32 at batch ")
        assert f"asked: batch {len(SOURCES)}, {beams} beam(s)" in lines[0]
    assert used == ["load_onnx_for_generation", "load_for_generation"]
    assert translate.fastest_backend(1, 2, "float32") == ("onnx", (1, 1))
    assert translate.fastest_backend(32, 5, "float32") == ("pytorch", (16, 4))


def test_auto_falls_back_to_pytorch_with_the_command_that_writes_the_graphs(
    folders, capsys, caplog, monkeypatch
):
    """Where the table names onnx but the folder has no graphs (or int8 ones for a float32 request), auto decodes
    with PyTorch and its line names the export command; with --compile, PyTorch's own flag decides. Only graphs
    the folder has but cannot use are warned of; a plain folder's line, and --compile's, are INFO."""
    monkeypatch.setattr(translate, "FASTEST", {(1, 1): {"float32": "onnx", "int8": "onnx"}})
    cases = (
        (folders["model"], (), logging.INFO, f"no ONNX graphs in {folders['model']} (`ode-export "),
        (folders["int8"], (), logging.WARNING, "holds int8 graphs (*_quantized.onnx): add --quantize int8"),
        (folders["fp32"], ("--quantize", "int8"), logging.WARNING, "holds float32 graphs, not the int8 ones"),
        (folders["fp32"], ("--compile",), logging.INFO, "--compile is PyTorch's"),
    )
    for folder, flags, level, hint in cases:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="ode_transformer.translate"):
            outputs = run(
                folder, capsys, "--num_beams", "1", "--max_new_tokens", "3", *flags, sources=SOURCES[:2]
            )
        assert len(outputs) == 2
        (record,) = [r for r in caplog.records if r.name == "ode_transformer.translate"]
        line = record.getMessage()
        assert line.startswith("backend pytorch: ") and hint in line and record.levelno == level, line
    assert f"`ode-export {folders['model']} OUT --onnx`, then translate OUT" in translate.onnx_problem(
        str(folders["model"]), None
    )


def test_bad_backend_combinations_are_parser_errors_naming_the_fix(folders, tmp_path, refused):
    shutil.copytree(folders["model"], tmp_path / "plain")
    cases = (
        (
            folders["fp32"],
            ["--compile"],
            "--compile is PyTorch's: leave out --compile, or use --backend pytorch",
        ),
        (folders["fp32"], ["--bf16"], "--bf16 is PyTorch's: leave out --bf16, or use --backend pytorch"),
        (folders["fp32"], ["--device", "cuda"], "not on cuda: use --device cpu, or --backend pytorch"),
        (tmp_path / "plain", [], f"`ode-export {tmp_path / 'plain'} OUT --onnx`, then translate OUT"),
        (folders["fp32"], ["--quantize", "int8"], "--onnx --quantize int8`, then translate OUT"),
        (folders["int8"], [], "add --quantize int8 to decode with them"),
    )
    for folder, flags, message in cases:
        error = refused(translate.main, [str(folder), "--backend", "onnx", "--no_progress", *flags])
        assert "error: --backend onnx" in error and message in error, error
