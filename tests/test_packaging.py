"""A non-editable ``pip install .`` into a fresh virtual environment gives working console commands.

The environment borrows this interpreter's installed dependencies through a ``.pth`` file (no download; the
``.pth`` files of that folder, such as an editable install's finder, are not run), and the package itself is
built from a copy of the sources with ``--no-deps --no-build-isolation --no-index``.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch
from tiny_folder import save_tiny_folder

from ode_transformer import cli

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("ode-train", "ode-translate", "ode-evaluate", "ode-export", "ode-model-card", "ode-push")
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "modeling_ode", "ode_transformer", "train", "hub")


def _install(tmp_path: Path) -> Path:
    """Copy the sources, create the environment, pip-install the copy; returns the environment's bin/."""
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=False)
    purelib = Path(subprocess.check_output(
        [environment / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip())  # fmt: skip
    (purelib / "borrowed_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(environment / "bin" / "python"), "install", "-q",
         "--no-deps", "--no-build-isolation", "--no-index", str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert not (purelib / "train").exists() and not (purelib / "hub").exists()
    assert (purelib / "ode_transformer" / "train" / "recipes" / "multi30k_en_de_cpu.yaml").is_file()
    return environment / "bin"


@pytest.mark.slow
def test_non_editable_install_gives_console_commands(tmp_path):
    bin_dir = _install(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"HF_HUB_OFFLINE": "1"}

    def call(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    located = call(
        str(bin_dir / "python"),
        "-c",
        "import modeling_ode, ode_transformer.train.run as r; print(modeling_ode.__file__)",
    )
    assert located.returncode == 0, located.stderr[-2000:]
    assert located.stdout.startswith(str(tmp_path / "venv")), located.stdout
    for generic in ("train", "hub"):
        assert call(str(bin_dir / "python"), "-c", f"import {generic}").returncode != 0, (
            f"{generic} is importable"
        )
    for command in COMMANDS:
        result = call(str(bin_dir / command), "--help")
        assert result.returncode == 0 and result.stdout.startswith("usage: "), (
            command,
            result.stderr[-2000:],
        )

    model, tokenizer = save_tiny_folder(tmp_path / "model", weight_scale=3)
    sources = ["the dog sleeps", "a cat runs in the warm park", "zwei Hunde"]
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    result = call(
        str(bin_dir / "ode-translate"), str(tmp_path / "model"), "--input", "src.txt", "--no_progress"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    with torch.no_grad():
        expected = [model.generate(**tokenizer([s], return_tensors="pt"))[0] for s in sources]
    texts = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in expected]
    assert all(texts) and result.stdout.splitlines() == texts


@pytest.mark.parametrize(
    ("command", "extra"), [(cli.train, "train"), (cli.evaluate, "train"), (cli.push, "hub")]
)
def test_a_missing_extra_names_the_extra_to_install(command, extra, monkeypatch):
    def import_without_extra(name):
        raise ModuleNotFoundError("No module named 'rouge_score'", name="rouge_score")

    monkeypatch.setattr(cli.importlib, "import_module", import_without_extra)
    with pytest.raises(SystemExit) as exit_info:
        command()
    assert f"install `ode-transformer[{extra}]`" in str(exit_info.value.code)
    assert "rouge_score" in str(exit_info.value.code) and "\n" not in str(exit_info.value.code)


def test_our_own_missing_modules_are_not_blamed_on_an_extra(monkeypatch):
    def broken(name):
        raise ModuleNotFoundError(
            "No module named 'ode_transformer.train.nope'", name="ode_transformer.train.nope"
        )

    monkeypatch.setattr(cli.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.train()
