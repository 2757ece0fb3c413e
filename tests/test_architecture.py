"""The code's shape: no measured figures in comments, no history in docstrings, the formatter followed,
docs/architecture.md's map true to the tree, and its import layers kept (import-linter's contracts in
pyproject.toml)."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
# Every folder of Python code; results and benchmark results are generated, not code.
CODE_FOLDERS = ("modeling_ode", "ode_transformer", "train", "hub", "experiments", "benchmarks", "tests")


def python_files(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (REPO / folder).rglob("*.py"))


# --- no measured figures in comments -------------------------------------------------------------------------------
# A figure is a number with a unit of time, memory or speed, a percentage or a multiple ("3x"), or a number beside
# a metric's name. Measured figures live in results files and in the docs that cite them; in a comment they go stale
# unseen. Statistical settings (a 95% interval, 80% power) are not measurements.
_NUMBER = r"(?<![\w.^])~?\d+(?:\.\d+)?"
_UNIT = r"(?:ms|µs|s|sec|seconds?|min|minutes?|hours?|[KMGT]i?B|tok/s|tokens/s|it/s)\b"
_METRIC = r"(?:BLEU|chrF|ROUGE(?:-\w+)?|GLEU|perplexity|ppl|loss)"
FIGURE = re.compile(
    rf"{_NUMBER}\s*{_UNIT}"
    rf"|{_NUMBER}%(?!\s*(?:confidence|CI|power|interval))"
    rf"|{_NUMBER}x\b"
    rf"|{_METRIC}\s+{_NUMBER}(?![\w.])"
    rf"|{_NUMBER}\s+{_METRIC}\b"
)


def comments(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of ``source``."""
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                found.append((node.body[0].lineno, docstring))
    return found


def figures(source: str) -> list[tuple[int, str]]:
    return sorted(
        (line + text[: match.start()].count("\n"), match.group(0))
        for line, text in comments(source)
        for match in FIGURE.finditer(text)
    )


def test_the_figure_check_catches_measurements_and_passes_settings():
    caught = '''"""Decodes fast (~20 min on 2 cores)."""
x = 1  # RK4 took ~0.6 s of system time
y = 2  # 13% above its prediction
z = 3  # an epoch takes about 3x a residual one
w = 4  # no summary at all (loss 6.5, ROUGE-1 0.66)
v = 5  # the int8 path lost 0.3 BLEU
'''
    assert [line for line, _ in figures(caught)] == [1, 2, 3, 4, 5, 5, 6]
    passed = '''"""The paper's 10k vocabulary, 2K-token batches, a 95% confidence interval, 80% power."""
x = 1  # SacreBLEU 13a; 2 n^3 FLOPs; d 512, 6-6 layers; batch 16 x 32
y = "took 3 s"  # a string is not a comment
'''
    assert figures(passed) == []


def test_no_comment_or_docstring_quotes_a_measured_figure():
    found = [
        f"{path.relative_to(REPO)}:{line}: {figure}"
        for path in python_files(*CODE_FOLDERS)
        if path.name != "test_architecture.py"
        for line, figure in figures(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "measured figures belong in results files and the docs:\n" + "\n".join(found)


# --- no history in comments -------------------------------------------------------------------------------------------
# A comment or docstring states what the code does now; how it behaved before, and which report's row found
# it, is history, and history goes in commit messages. Narrow on purpose: a review's row or item
# ("#56 row 11", "issue 56 row 19", "#55 item 2") and three forms of a past behaviour ("used to", "now refused"
# and the past perfect: "had" with a participle, "had been", "had dropped", "had made"). "used to" after a form
# of "be" is the passive ("is used to pick"), and "had" with an object or "to" is no past perfect ("had no test
# split", "had to be dropped"). A tracker issue named at all is the next check's.
_IRREGULAR_PARTICIPLES = (
    "been|made|done|gone|left|lost|kept|got|put|run|set|shown|taken|given|written|broken|chosen|found|held|said"
    "|sent|told|brought|built|become|begun|seen|known|thrown"
)
HISTORY = re.compile(
    r"#\d+,? (?:rows?|items?) \d"
    r"|\bissue #?\d+,? (?:rows?|items?) \d"
    r"|(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bbeing )(?<!\bwas )(?<!\bwere )\bused to "
    rf"|\bhad (?:\w+ed|{_IRREGULAR_PARTICIPLES})\b"
    r"|\bnow refused\b",
    re.IGNORECASE,
)


def history(source: str) -> list[tuple[int, str]]:
    return sorted(
        (line + text[: match.start()].count("\n"), match.group(0))
        for line, text in comments(source)
        for match in HISTORY.finditer(text)
    )


def test_the_history_check_catches_narration_and_passes_behaviour():
    caught = '''"""#56 row 11: max_steps: "ten" in a recipe gave argparse's message."""
x = 1  # issue 56 row 19: every refusal left a traceback file
y = 2  # ode-train names itself (it used to print a bare "error:")
z = 3  # a BOM had been tokenized into the first line
w = 4  # #44 rows 13 and 14; #55 item 2
def f():
    """A wrong shape is now refused by name."""
def g():
    """An evaluation keeps the training record. It had dropped the training section."""
v = 6  # it had replaced its hub_metrics.json; pandas had made the first column an index
'''
    assert [line for line, _ in history(caught)] == [1, 2, 3, 4, 5, 5, 7, 9, 10, 10]
    passed = '''"""The default block is the one the verdict's tiers test; row 0 of the tableau is empty."""
x = 1  # the seed is used to pick the batches; the bound was used to size the cache
y = "it used to print a bare error"  # a string is not a comment
z = 3  # flags the study no longer sets are named; the upcycling study starts from residual seeds
w = 4  # the data had no test split; every pair that had to be dropped, with why
'''
    assert history(passed) == []


def test_no_comment_or_docstring_narrates_history():
    found = [
        f"{path.relative_to(REPO)}:{line}: {phrase}"
        for path in python_files(*CODE_FOLDERS)
        if path.name != "test_architecture.py"
        for line, phrase in history(path.read_text(encoding="utf-8"))
    ]
    assert found == [], (
        "state the behaviour pinned in the present tense; history belongs in commit messages:\n"
        + "\n".join(found)
    )


# --- no tracker issue numbers in code -----------------------------------------------------------------------------
# An issue number tells a reader nothing without the tracker: the code says what it does and why, and the commit
# that changed it names the issue. An upstream report (`pytorch/pytorch#136543`) stays: it is where a workaround's
# reason is kept. Strings count too (a results file's text is read without the tracker as well).
TRACKER = re.compile(r"\bissues? #?\d+|(?<![\w/])#\d{2,}\b", re.IGNORECASE)


def tracker_numbers(source: str) -> list[tuple[int, str]]:
    return [
        (number, match.group(0))
        for number, line in enumerate(source.splitlines(), start=1)
        for match in TRACKER.finditer(line)
    ]


def test_the_tracker_check_catches_issue_numbers_and_passes_upstream_reports():
    caught = "x = 1  # issue 42: the loss\n# issues 54, 61\ny = 'goal (issue #57)'\n# the goals of #43\n"
    assert [line for line, _ in tracker_numbers(caught)] == [1, 2, 3, 4]
    passed = "x = 1  # (pytorch/pytorch#136543)\ncolor = '#1f77b4'  # an issue with the tokenizer\n"
    assert tracker_numbers(passed) == []


def test_no_code_names_a_tracker_issue():
    found = [
        f"{path.relative_to(REPO)}:{line}: {number}"
        for path in python_files(*CODE_FOLDERS)
        if path.name != "test_architecture.py"
        for line, number in tracker_numbers(path.read_text(encoding="utf-8"))
    ]
    assert found == [], (
        "say what the code does and why; the issue belongs in the commit message:\n" + "\n".join(found)
    )


# --- the cache in its own file ---------------------------------------------------------------------------------------


def test_the_cache_lives_in_cache_ode_and_attention_never_asks_its_class():
    """The per-stage layout, the beam-search cache, its attention and the generation hook are in cache_ode.py (an
    exported folder ships it); attention reads a cache through the contract documented on `BeamSearchCache`."""
    import inspect

    from modeling_ode import cache_ode, modeling_ode_transformer

    for name in (
        "StageCacheLayout",
        "BeamSlot",
        "BeamSearchCache",
        "beam_attention_forward",
        "ODEGenerationMixin",
    ):
        assert getattr(cache_ode, name).__module__ == "modeling_ode.cache_ode", name
    attention = inspect.getsource(modeling_ode_transformer.ODETransformerAttention)
    for cache_class in ("BeamSearchCache", "BeamSlot", "DynamicCache", "StaticCache"):
        assert cache_class not in attention, cache_class
    assert "beams_per_source(cache)" in inspect.getdoc(cache_ode.BeamSearchCache)


# --- the formatter followed ------------------------------------------------------------------------------------------
PACKAGES = ("modeling_ode", "ode_transformer", "train", "hub", "experiments", "benchmarks")
MAX_FORMATTER_SKIPS = 10  # a few hand-aligned tables of goals, at most


def test_the_formatter_is_followed_outside_tests():
    skips = [
        f"{path.relative_to(REPO)}:{number}"
        for path in python_files(*PACKAGES)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if re.search(r"#\s*fmt:\s*(skip|off)", line)
    ]
    assert len(skips) <= MAX_FORMATTER_SKIPS, "\n".join(skips)


def wrapped_by_a_comment(source: str, line_length: int = 110) -> list[int]:
    """The first lines of the statements that span lines only because of a trailing comment: without their comments
    they would fit on one line (the formatter then wraps them around the comment)."""
    found, statement = [], []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        statement.append(token)
        if token.type not in (tokenize.NEWLINE, tokenize.ENDMARKER):
            continue
        layout = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        code = [t for t in statement if t.type not in layout and t.type != tokenize.ENDMARKER]
        trailing = any(
            t.type == tokenize.COMMENT and any(c.start[0] == t.start[0] for c in code) for t in statement
        )
        statement = []
        if not code or not trailing or code[0].start[0] == code[-1].end[0]:
            continue
        if any(t.start[0] != t.end[0] for t in code):  # a multi-line string keeps its lines
            continue
        width = code[0].start[1] + sum(len(t.string) + 1 for t in code)
        if width <= line_length:
            found.append(code[0].start[0])
    return found


def test_comments_sit_on_their_own_lines_rather_than_wrap_a_statement():
    assert wrapped_by_a_comment(
        "x = (\n    1  # one\n)\ny = 2  # fine\nz = [\n    1,  # one\n    2,\n]\n"
    ) == [1, 5]
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in python_files(*PACKAGES)
        for line in wrapped_by_a_comment(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "put these comments on their own line above the statement:\n" + "\n".join(found)


# --- the import layers -----------------------------------------------------------------------------------------------
# import-linter reads modules from their folders; in a clone train/ and hub/ sit beside ode_transformer/ (pyproject's
# package-dir maps them into it), so the contracts are checked on a copy laid out as an install lays the tree out.
LAYOUT = {
    "modeling_ode": "modeling_ode",
    "ode_transformer": "ode_transformer",
    "ode_transformer/train": "train",
    "ode_transformer/hub": "hub",
    "experiments": "experiments",
    "benchmarks": "benchmarks",
}


def installed_layout(root: Path) -> Path:
    import shutil

    for target, source in LAYOUT.items():
        shutil.copytree(REPO / source, root / target, ignore=shutil.ignore_patterns("__pycache__", "recipes"))
    return root


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    import os
    import sys

    env = {**os.environ, "PYTHONPATH": str(root)}
    command = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(sys.argv[1]))"
    return subprocess.run(
        [sys.executable, "-c", command, str(REPO / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_layers_hold(tmp_path):
    """Layers point down (benchmarks, experiments, ode_transformer, modeling_ode); inside ode_transformer, train and
    hub import neither each other nor anything but the shared modules below them, and every module has its layer;
    no package's modules import each other in a circle."""
    run = lint_imports(installed_layout(tmp_path))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "3 kept, 0 broken" in run.stdout


def test_the_import_layers_catch_an_import_between_the_tools(tmp_path):
    root = installed_layout(tmp_path)
    (root / "ode_transformer" / "hub" / "crossing.py").write_text("from ode_transformer.train import tasks\n")
    run = lint_imports(root)
    assert run.returncode != 0 and "ode_transformer.hub.crossing -> ode_transformer.train.tasks" in run.stdout


# import-linter sees `import` statements only: a module reached through importlib, or named in a string and imported
# later, crosses the layers unseen. The console commands' launcher (cli.py) and their kept flags (parsers.py) reach
# the tools through importlib by design; no other module of the shared ground, and neither tool, may.
LAUNCHERS = ("cli.py", "parsers.py")
# Which tool each folder's modules must not name: train/ and hub/ each other, the shared ground both.
UNREACHABLE = {"train": ("hub",), "hub": ("train",), "ode_transformer": ("train", "hub")}
_DYNAMIC_IMPORTS = ("import_module", "__import__", "find_spec", "run_module")


def named_tools(source: str, tools: tuple[str, ...]) -> list[int]:
    """The lines of ``source`` that import one of ``tools`` dynamically: a call of importlib (``import_module``,
    ``find_spec``, ...) or runpy with a string naming it, or a string that is nothing but its module's name."""
    tool = "|".join(tools)
    module = re.compile(rf"^ode_transformer\.(?:{tool})(?:\.\w+)*$")
    mentioned = re.compile(rf"\bode_transformer\.(?:{tool})\b")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and module.match(node.value):
            found.append(node.lineno)
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            strings = [
                found_node.value
                for argument in node.args
                for found_node in ast.walk(argument)
                if isinstance(found_node, ast.Constant) and isinstance(found_node.value, str)
            ]
            if name in _DYNAMIC_IMPORTS and any(mentioned.search(string) for string in strings):
                found.append(node.lineno)
    return sorted(set(found))


def test_the_dynamic_import_check_catches_a_tool_named_in_a_string():
    caught = """name = "ode_transformer.hub.model_card"
card = importlib.import_module(name)
spec = importlib.util.find_spec("ode_transformer.hub")
tool = import_module(f"ode_transformer.hub.{module}")
"""
    assert named_tools(caught, ("hub",)) == [1, 3, 4]
    passed = """logger.info("model card: python -m ode_transformer.hub.model_card MODEL_DIR %s", path)
metrics = importlib.import_module("ode_transformer.train.metrics")
spec = DataSpec("hub", name)
"""
    assert named_tools(passed, ("hub",)) == []


def test_no_module_but_the_launcher_reaches_a_tool_through_importlib():
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for folder, tools in UNREACHABLE.items()
        for path in python_files(folder)
        if not (folder == "ode_transformer" and path.name in LAUNCHERS)
        for line in named_tools(path.read_text(encoding="utf-8"), tools)
    ]
    assert found == [], "import it where import-linter sees it, from a layer that may:\n" + "\n".join(found)


# --- the map ---------------------------------------------------------------------------------------------------------
MAPPED = ("modeling_ode", "ode_transformer", "train", "hub", "experiments", "benchmarks")


def map_sections() -> dict[str, set[str]]:
    """The module names (``name.py``) each ``### `folder/` `` section of docs/architecture.md names."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    sections = re.split(r"^### `(\w+)/`.*$", text, flags=re.M)
    return {
        folder: set(re.findall(r"`(\w+\.py)`", body)) for folder, body in zip(sections[1::2], sections[2::2])
    }


def test_the_map_names_every_module_and_only_modules_that_exist():
    sections = map_sections()
    assert sorted(sections) == sorted(MAPPED)
    for folder in MAPPED:
        modules = {path.name for path in (REPO / folder).rglob("*.py") if path.name != "__init__.py"}
        assert sections[folder] == modules, (
            f"docs/architecture.md, `{folder}/`: missing {sorted(modules - sections[folder])}, "
            f"gone {sorted(sections[folder] - modules)}"
        )


# One file per name: a module's name says which concern it holds, so no two folders share one. Each package's
# `__init__.py` aside, and `run.py`, the entry point of train/ and of experiments/.
SHARED_NAMES = ("__init__.py", "run.py")


def test_no_module_name_is_used_twice_outside_tests():
    folders: dict[str, list[str]] = {}
    for path in python_files(*PACKAGES):
        folders.setdefault(path.name, []).append(str(path.parent.relative_to(REPO)))
    twice = {name: where for name, where in folders.items() if len(where) > 1 and name not in SHARED_NAMES}
    assert twice == {}, f"name each module for its concern: {twice}"


# --- the "how to add" recipes of docs/architecture.md, each followed once --------------------------------------------


def test_recipe_a_method_is_one_tableau(monkeypatch, device):
    """Heun's third-order method added as docs/architecture.md says: its name in the `ODEMethodName` Literal and its
    tableau, with its order, in `ODE_METHODS`, its step written out by hand. The checks tests/test_ode.py runs on
    every entry hold for it (the Literal is the catalogue, the block is the hand-written step, the declared order is
    the conditions' and the measured one), and it builds encoder and decoder blocks that decode with beams (the
    per-stage cache has its stages)."""
    from typing import Literal, get_args

    import pytest
    import torch
    from tableau_order import linear_order, measured_slope, order_from_conditions

    from modeling_ode import ButcherTableau, ODETransformerConfig, ODETransformerForConditionalGeneration, ode

    heun3 = ButcherTableau(
        a=((), (1 / 3,), (0.0, 2 / 3)),
        b=(0.25, 0.0, 0.75),
        c=(0.0, 1 / 3, 2 / 3),
        order=3,
        equation="y + F1 / 4 + 3 F3 / 4, F2 = F(y + F1 / 3), F3 = F(y + 2 F2 / 3)",
        description="a third-order Runge-Kutta block (Heun's third-order method)",
    )
    monkeypatch.setattr(ode, "ODEMethodName", Literal[(*get_args(ode.ODEMethodName), "heun3")])
    monkeypatch.setitem(ode.ODE_METHODS, "heun3", heun3)

    def by_hand(f, y, h):
        k1 = f(y)
        k2 = f(y + h / 3 * k1)
        k3 = f(y + 2 * h / 3 * k2)
        return y + h * (k1 / 4 + 3 * k3 / 4)

    assert get_args(ode.ODEMethodName) == tuple(ode.ODE_METHODS)
    y = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    coefficients = ode.StageCoefficients("tableau", heun3, 6).to(device=device, dtype=torch.float64)
    step = ode.ode_step(y, lambda x, i: torch.tanh(x), heun3, coefficients, step_size=0.3)
    torch.testing.assert_close(step, by_hand(torch.tanh, y, 0.3), rtol=1e-12, atol=1e-12)
    assert heun3.order == order_from_conditions(heun3) == 3
    assert measured_slope(heun3, "nonlinear", device) == pytest.approx(4, abs=0.15)
    assert measured_slope(heun3, "linear", device) == pytest.approx(linear_order(heun3) + 1, abs=0.15)

    config = ODETransformerConfig.from_preset("tiny", encoder_ode_method="heun3", decoder_ode_method="heun3")
    torch.manual_seed(0)
    model = ODETransformerForConditionalGeneration(config).to(device).eval()
    assert model.get_decoder().cache_layout.stages == 3
    source = torch.randint(4, config.vocab_size, (2, 7), device=device)
    out = model.generate(source, num_beams=2, max_new_tokens=5, do_sample=False)
    uncached = model.generate(source, num_beams=2, max_new_tokens=5, do_sample=False, use_cache=False)
    assert torch.equal(out, uncached)


def test_recipe_a_study_is_run_reported_and_documented(tmp_path):
    """A study's results, reported (`experiments.report STUDY`), then its marker in the template, then the study
    document (`--write-docs`): the table is the report's. A marker placed before the report has no table to show."""
    import dataclasses
    import json
    import shutil

    import pytest

    from experiments.report import first_table, report, study_document
    from experiments.studies import STUDIES

    study = dataclasses.replace(STUDIES["ptb"], name="toy_study")
    folder = tmp_path / "results" / "toy_study" / "cpu"
    folder.mkdir(parents=True)
    runs = sorted((REPO / "results" / "ptb" / "cpu").glob("*-seed0.json"))
    # the study's runs of one device: a batch that mixes devices is refused (experiments.records)
    for path in [p for p in runs if json.loads(p.read_text())["device"]["name"] == "AMD EPYC"][:4]:
        shutil.copy(path, folder / path.name)
    template = tmp_path / "docs" / "templates" / "results.md"
    template.parent.mkdir(parents=True)
    template.write_text("# Studies\n\n## A toy study\n\n<!-- table: results/toy_study/cpu -->\n")
    with pytest.raises(FileNotFoundError):  # documented before it is reported
        study_document(template, tmp_path)
    report(study, "cpu", tmp_path / "results")
    document = study_document(template, tmp_path)
    assert first_table((folder / "README.md").read_text()) in document


def test_recipe_every_benchmark_has_a_quick_test():
    """Every benchmark module is run by tests/test_benchmarks.py in a mode of seconds (`--quick`, or `--dry-run`)."""
    tests = (REPO / "tests" / "test_benchmarks.py").read_text(encoding="utf-8")
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        if path.name in ("__init__.py", "common.py"):
            continue
        run = re.search(rf"{path.stem}[\s\S]{{0,400}}?--(quick|dry-run)", tests)
        assert run, f"benchmarks/{path.name}: no --quick test in tests/test_benchmarks.py"
