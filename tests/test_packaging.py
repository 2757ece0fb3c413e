"""A non-editable ``pip install .`` into a fresh virtual environment gives working console commands.

The environment borrows this interpreter's installed dependencies through a ``.pth`` file (no download; the
``.pth`` files of that folder, such as an editable install's finder, are not run), and the package itself is
built from a copy of the sources with ``--no-deps --no-build-isolation --no-index``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny_folder import save_tiny_folder

from ode_transformer import cli

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("ode-train", "ode-translate", "ode-evaluate", "ode-export", "ode-model-card", "ode-push")
SOURCES = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "modeling_ode",
    "ode_transformer",
    "train",
    "hub",
    "docs",
    "results/verdict.md",  # the one file of results/ that the wheel ships
)


def _install(tmp_path: Path) -> Path:
    """Copy the sources, create the environment, pip-install the copy; returns the environment's bin/."""
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (source / name).parent.mkdir(exist_ok=True)
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
    assert (purelib / "ode_transformer" / "docs" / "data-and-tests.md").is_file()  # the guides messages name
    assert [path.name for path in (purelib / "ode_transformer" / "results").iterdir()] == ["verdict.md"]
    installed_documents = {str(path.relative_to(purelib)) for path in purelib.rglob("*.md")}
    assert installed_documents == shipped_documents().keys()  # what the cheap link check reads is what ships
    return environment / "bin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """One non-editable install for this module's slow tests: the environment's bin/."""
    return _install(tmp_path_factory.mktemp("install"))


@pytest.mark.slow
def test_non_editable_install_gives_console_commands(tmp_path, installed):
    bin_dir = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"HF_HUB_OFFLINE": "1"}

    def call(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    located = call(
        str(bin_dir / "python"),
        "-c",
        "import modeling_ode, ode_transformer.train.run as r; print(modeling_ode.__file__)",
    )
    assert located.returncode == 0, located.stderr[-2000:]
    assert located.stdout.startswith(str(bin_dir.parent)), located.stdout
    urls = call(
        str(bin_dir / "python"),
        "-c",
        "from importlib.metadata import metadata as m; print(m('ode-transformer')['Project-URL'])",
    )
    assert urls.stdout.strip() == "Paper, https://aclanthology.org/2022.acl-long.571", urls.stderr[-2000:]
    for generic in ("train", "hub"):
        assert call(str(bin_dir / "python"), "-c", f"import {generic}").returncode != 0, (
            f"{generic} is importable"
        )
    for command in COMMANDS:
        result = call(str(bin_dir / command), "--help")
        assert result.returncode == 0 and result.stdout.startswith(f"usage: {command}"), (
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
    ("command", "extra", "argv"),
    [
        (cli.train, "train", []),
        (cli.evaluate, "train", ["--task", "translation", "--hyp", "hyp.txt"]),
        (cli.push, "hub", []),
    ],
)
def test_a_missing_extra_names_the_extra_to_install(command, extra, argv, monkeypatch, refused):
    def import_without_extra(name):
        raise ModuleNotFoundError("No module named 'rouge_score'", name="rouge_score")

    # arguments the command's parser takes: a refused one is answered before the module is imported
    monkeypatch.setattr(sys, "argv", ["command", *argv])
    monkeypatch.setattr(cli.importlib, "import_module", import_without_extra)
    error = refused(command)
    assert f"install the [{extra}] extra (pip install '.[{extra}]' in a clone" in error
    assert "rouge_score" in error and error.count("\n") == 1


@pytest.mark.both_cpus
def test_a_missing_extra_imported_inside_main_is_named_too(monkeypatch, refused):
    """Some modules import an extra's package late (ode_transformer.train.run draws its plots after training)."""

    def main():
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    # the command's own line, not pytest's, whose flags ode-train would refuse first
    monkeypatch.setattr(sys, "argv", ["ode-train"])
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: SimpleNamespace(main=main))
    assert "install the [train] extra (pip install '.[train]'" in refused(cli.train)


@pytest.mark.both_cpus
def test_our_own_missing_modules_are_not_blamed_on_an_extra(monkeypatch):
    def broken(name):
        raise ModuleNotFoundError(
            "No module named 'ode_transformer.train.nope'", name="ode_transformer.train.nope"
        )

    monkeypatch.setattr(sys, "argv", ["ode-train"])  # not pytest's flags, which ode-train would refuse first
    monkeypatch.setattr(cli.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.train()


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, re.DOTALL)


def _package_imports(notebook: Path) -> str:
    """The notebook's import statements of this package (modeling_ode, ode_transformer)."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    statements = []
    for cell in (c for c in cells if c["cell_type"] == "code"):
        source = "".join(cell["source"])
        for node in ast.parse("\n".join(s for s in source.splitlines() if not s.startswith(("%", "!")))).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(name.split(".")[0] in ("modeling_ode", "ode_transformer") for name in names):
                    statements.append(ast.unparse(node))
    return "\n".join(statements)


@pytest.mark.slow
def test_the_installed_package_works_outside_the_clone(tmp_path, shared_data, installed):
    """The issue's acceptance, from a folder outside the clone with a non-editable install: ode-train with a
    packaged recipe by name and --data_dir, ode-translate and ode-evaluate on its output, every README Python
    snippet, the notebooks' imports of this package, and the trained folder's card snippets, as written."""
    bin_dir = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ODE_"))}
    env |= {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / ".hf")}
    work = tmp_path / "elsewhere"
    work.mkdir()

    def call(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run(
            args, cwd=work, env=env, input=stdin, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, (args[:2], done.stderr[-3000:])
        return done

    tiny = ["--d_model", "32", "--encoder_layers", "1", "--decoder_layers", "1", "--encoder_ffn_dim", "64",
            "--decoder_ffn_dim", "64", "--vocab_size", "400", "--max_train_samples", "400",
            "--max_eval_samples", "8", "--max_test_samples", "8", "--eval_strategy", "no", "--save_strategy", "no",
            "--max_target_length", "16", "--report_to", "none", "--disable_tqdm", "true"]  # fmt: skip
    call(str(bin_dir / "ode-train"), "multi30k_en_de_cpu", "--data_dir", str(shared_data), "--max_steps", "5",
         "--output_dir", "run", *tiny)  # fmt: skip
    model = work / "run"
    sources = "A man rides a bike.\nTwo dogs play in the snow.\n"
    (work / "src.en").write_text(sources, encoding="utf-8")
    (work / "ref.de").write_text("Ein Mann fährt Rad.\nZwei Hunde spielen im Schnee.\n", encoding="utf-8")
    call(str(bin_dir / "ode-translate"), "run", "--input", "src.en", "--output", "hyp.de", "--no_progress")
    assert len((work / "hyp.de").read_text(encoding="utf-8").splitlines()) == 2
    scored = call(
        str(bin_dir / "ode-evaluate"), "--task", "translation", "--hyp", "hyp.de", "--ref", "ref.de"
    )
    assert "BLEU" in scored.stdout or "bleu" in scored.stdout.lower()

    python = str(bin_dir / "python")
    for block in _python_blocks((REPO / "README.md").read_text(encoding="utf-8")):
        call(python, "-c", block.replace("path/to/model", str(model)))  # the README's placeholder folder
    notebooks = sorted((REPO / "notebooks").glob("*.ipynb"))
    call(python, "-c", "\n".join(_package_imports(notebook) for notebook in notebooks))  # one interpreter
    card_snippets = _python_blocks((model / "README.md").read_text(encoding="utf-8"))
    assert len(card_snippets) == 2
    for snippet in card_snippets:
        call(python, "-c", snippet.replace("path/to/run", str(model)))


def test_the_oldest_constraints_are_the_floors_of_pyproject():
    """`make test-oldest` installs exactly the lowest versions pyproject allows."""
    import tomllib
    from packaging.requirements import Requirement

    floors = {}
    for line in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        floors[requirement.name] = lower[0] if lower else None
    pins = dict(
        line.split("==")
        for line in (REPO / ".ci" / "oldest-constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert pins and all(floors[name] is not None and pins[name].startswith(floors[name]) for name in pins), (
        pins,
        floors,
    )
    assert set(floors) - set(pins) == {"torch"}  # torch: the machine's CPU (or CUDA) build, installed first


@pytest.fixture(scope="module")
def dev_requirements() -> dict[str, str]:
    """The `dev` extra of pyproject: name -> version specifier."""
    import tomllib
    from packaging.requirements import Requirement

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {(r := Requirement(line)).name: str(r.specifier) for line in extras["dev"]}


def test_the_tests_sharing_a_module_fixture_run_on_one_worker(dev_requirements, request):
    """`make test` (`pytest -n 2 --dist loadgroup`): a test sharing its module's fixture carries the module's
    `xdist_group` (tests/conftest.py), and on a worker its node id ends with the group, the one thing xdist's
    scheduler reads. Under pytest 9.2 it does not (pytest-dev/pytest-xdist#1386): the dev extra keeps pytest
    below it."""
    assert dev_requirements["pytest"] == "<9.2,>=8"
    group = request.module.__name__
    assert request.node.get_closest_marker("xdist_group").args == (group,)
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by `pytest -n N --dist loadgroup`")
    assert request.node.nodeid.endswith(f"@{group}"), request.node.nodeid


def test_install_lines_name_a_clone_or_a_built_wheel_never_pypi():
    """The package is not on PyPI: no document, model-card template or error message says `pip install
    ode-transformer`; they say `pip install .` in a clone or a built wheel, and the wheel the README names is the
    one `python -m build` writes from pyproject's name and version."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wheel = f"dist/{project['name'].replace('-', '_')}-{project['version']}-py3-none-any.whl"
    readme = (REPO / "README.md").read_text()
    assert wheel in readme and "pip install ." in readme and "python -m build" in readme
    texts = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    texts += [
        path for folder in ("hub", "train", "ode_transformer") for path in (REPO / folder).rglob("*.py")
    ]
    pypi = re.compile(r"pip install ['\"]?ode-transformer")
    assert [str(path) for path in texts if pypi.search(path.read_text(encoding="utf-8"))] == []
    assert cli.install_command("hub") == (
        "pip install '.[hub]' in a clone of ode-transformer, or pip install 'ode_transformer-*.whl[hub]'"
    )


def _user_facing_strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings: messages, help texts, logged lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and ast.get_docstring(node, clean=False) is not None
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_messages_name_no_repository_file_the_wheel_lacks():
    """What the installed commands print names no file of the repository that the wheel does not ship (no
    docs/*.md path, nothing under results/ or benchmarks/results); a guide, or the verdict, is named by
    `ode_transformer.cli.guide`, which finds it in a clone or in the install, where pyproject ships the guides and
    results/verdict.md."""
    import tomllib

    named = [
        f"{path.relative_to(REPO)}:{line}: {text[:80]!r}"
        for package in ("modeling_ode", "ode_transformer", "train", "hub")
        for path in sorted((REPO / package).rglob("*.py"))
        for line, text in _user_facing_strings(path)
        if re.search(r"\bdocs/[\w.-]+\.md|\bresults/", text)
    ]
    assert named == []
    guide = Path(cli.guide("data-and-tests.md"))
    assert guide.is_file() and guide.parent == REPO / "docs"
    verdict = Path(cli.guide("verdict.md", "results"))
    assert verdict.is_file() and verdict.parent == REPO / "results"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder, files in (("docs", "docs", ["*.md"]), ("results", "results", ["verdict.md"])):
        assert project["package-dir"][f"ode_transformer.{package}"] == folder
        assert f"ode_transformer.{package}" in project["packages"]
        assert project["package-data"][f"ode_transformer.{package}"] == files


def _source_folder(package: str, package_dir: dict[str, str]) -> Path:
    """Where setuptools takes ``package`` from: the nearest ``package-dir`` entry above it, else its own path."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        mapped = package_dir.get(".".join(parts[:cut]))
        if mapped is not None:
            return REPO / mapped / Path(*parts[cut:])
    return REPO / Path(*parts)


def shipped_documents() -> dict[str, Path]:
    """The Markdown files the wheel ships, by their path inside it (``ode_transformer/docs/install.md``), each
    with its file in this clone: pyproject's ``packages``, ``package-dir`` and ``package-data``, read as
    setuptools reads them (a package's data are the files its patterns match in its own folder)."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    documents = {}
    for package in setuptools["packages"]:
        folder = _source_folder(package, setuptools.get("package-dir", {}))
        for pattern in setuptools.get("package-data", {}).get(package, []):
            for path in sorted(folder.glob(pattern)):
                if path.suffix == ".md" and path.is_file():
                    documents[str(Path(*package.split("."), path.name))] = path
    return documents


MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
FENCED_CODE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _relative_links(markdown: str) -> list[str]:
    """The link targets of ``markdown`` that are neither addresses (``https:``, ``mailto:``) nor in code blocks."""
    targets = MARKDOWN_LINK.findall(FENCED_CODE.sub("", markdown))
    return [target for target in targets if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target)]


def _heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCED_CODE.sub("", markdown), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def broken_shipped_links(documents: dict[str, Path]) -> list[str]:
    """Each relative link of the shipped ``documents`` that leads to no shipped document, or to a heading it lacks,
    as ``DOCUMENT: TARGET``; paths resolve as they lie in the wheel."""
    import posixpath

    broken = []
    for inside, source in documents.items():
        markdown = source.read_text(encoding="utf-8")
        for target in _relative_links(markdown):
            path, _, heading = target.partition("#")
            linked = posixpath.normpath(posixpath.join(posixpath.dirname(inside), path)) if path else inside
            if linked not in documents:
                broken.append(f"{inside}: {target} (not in the wheel)")
            elif heading and heading not in _heading_anchors(documents[linked].read_text(encoding="utf-8")):
                broken.append(f"{inside}: {target} (no such heading in {linked})")
    return broken


def test_every_relative_link_of_the_shipped_docs_resolves_inside_the_wheel(tmp_path):
    """The guides the wheel ships link only to guides it ships (and to headings they have): a link to a repository
    file it lacks (``../benchmarks/results/...``, ``../README.md``) leads nowhere in an install. The check itself
    finds a link that leaves, and a missing heading."""
    documents = shipped_documents()
    assert {"ode_transformer/docs/install.md", "ode_transformer/hub/README.md"} <= documents.keys()
    assert "ode_transformer/results/verdict.md" in documents
    assert broken_shipped_links(documents) == []

    guide = tmp_path / "guide.md"
    guide.write_text(
        "# A guide\n\n## The ONNX graphs\n\n[out](../benchmarks/results/x.md), [README](../README.md#safety), "
        "[here](#the-onnx-graphs), [there](#gone), [web](https://example.com/a.md), "
        "[install](install.md#no-heading)\n\n```\n[in code](../nowhere.md)\n```\n",
        encoding="utf-8",
    )
    documents["ode_transformer/docs/guide.md"] = guide
    assert broken_shipped_links(documents) == [
        "ode_transformer/docs/guide.md: ../benchmarks/results/x.md (not in the wheel)",
        "ode_transformer/docs/guide.md: ../README.md#safety (not in the wheel)",
        "ode_transformer/docs/guide.md: #gone (no such heading in ode_transformer/docs/guide.md)",
        "ode_transformer/docs/guide.md: install.md#no-heading (no such heading in ode_transformer/docs/install.md)",
    ]


def test_an_install_looks_for_no_data_folder_beside_site_packages(tmp_path, monkeypatch):
    """A clone's shared corpora are beside it; an installed package has no such neighbour, and a missing corpus
    says to pass --data_dir, not that site-packages/shared/data/multi30k is missing."""
    from ode_transformer.train import data

    installed = tmp_path / "site-packages" / "ode_transformer" / "train"
    installed.mkdir(parents=True)
    assert data.clone_data_root(installed) is None
    clone = tmp_path / "work" / "ode-transformer"
    (clone / "train").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("")
    assert data.clone_data_root(clone / "train") == tmp_path / "work" / "shared" / "data"
    monkeypatch.setattr(data, "_DEFAULT_ROOT", None)
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    with pytest.raises(data.MissingCorpusError) as missing:
        data.shared_folder("multi30k")
    assert str(missing.value) == (
        "shared corpus 'multi30k': no data folder given; pass --data_dir DIR (root=DIR in Python) or set "
        "ODE_DATA_DIR=DIR, DIR being the folder that holds multi30k/"
    )
