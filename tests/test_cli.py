"""The console commands (ode_transformer/cli.py): what a user can fix ends in one line and exit code 2, checked
before any work; a traceback is kept only for an unexpected error, and they do not pile up.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from tiny_run import (
    TINY_RUN,
    write,
)

import ode_transformer.loading
import ode_transformer.train.arguments
import ode_transformer.train.evaluation
import ode_transformer.train.run
import ode_transformer.train.saved_model
import ode_transformer.train.trainer
from ode_transformer import cli, translate
from ode_transformer.train import averaging, evaluate_predictions
from ode_transformer.train.arguments import parse_arguments


@pytest.mark.both_cpus
@pytest.mark.parametrize(
    ("main", "flags", "fragment"),
    [
        (translate.main, ["--batch_size", "0"], "--batch_size: expected a positive integer, got 0"),
        (translate.main, ["--output", "no/such/folder/hyp.txt"], "its folder no/such/folder does not exist"),
        (averaging.main, ["--last", "-1", "--out", "avg"], "--last: expected a positive integer, got -1"),
        (
            translate.main,
            ["--device", "gpu"],
            "--device gpu: not a torch device; e.g. cpu, cuda, cuda:1 or mps",
        ),
    ],
    ids=["batch size 0", "output folder missing", "average the last -1", "unknown device"],
)
def test_counts_and_output_folders_are_checked_before_any_work(
    tmp_path, capsys, main, flags, fragment, refused
):
    """--batch_size 0 put everything in one batch and --last 0 averaged every checkpoint; a missing output
    folder failed only after all the decoding."""
    assert fragment in refused(main, [str(tmp_path / "model"), *flags])


@pytest.mark.both_cpus
def test_an_output_over_an_input_or_a_folder_is_refused_before_any_work(tmp_path, capsys, refused):
    """`--output` equal to `--input` replaced the source with hypotheses, ode-evaluate's `--output` equal to
    `--ref` replaced the reference with JSON, and an existing folder failed only after all the decoding."""
    source = write(tmp_path / "in.txt", "a dog\n")
    reference = write(tmp_path / "ref.txt", "ein Hund\n")
    cases = [
        (translate.main, [str(tmp_path / "model"), "--input", str(source), "--output", str(source)],
         f"--output {source} is the --input file: writing it would replace that input"),
        (translate.main, [str(tmp_path / "model"), "--input", str(source), "--output", str(tmp_path)],
         f"--output {tmp_path} is a folder: give a file name in it"),
        (evaluate_predictions.main, ["--task", "translation", "--hyp", str(source), "--ref", str(reference),
                                     "--output", str(reference)], f"--output {reference} is the --ref file"),
    ]  # fmt: skip
    for main, argv, fragment in cases:
        assert fragment in refused(main, argv)
    assert (source.read_text(), reference.read_text()) == ("a dog\n", "ein Hund\n")


def kept_traceback(error: str, line: str) -> Path:
    """The file a console command's one-line error names as keeping its traceback: stderr must be exactly
    ``line`` (a regular expression) followed by where the traceback is, and nothing else."""
    match = re.fullmatch(line + r" \(traceback in (\S+); ODE_TRACEBACK=1 prints it\)\n", error)
    assert match, error
    return Path(match.group(1))


@pytest.mark.both_cpus
def test_console_commands_end_bad_input_with_one_line_and_exit_code_2(tmp_path, monkeypatch, capsys, refused):
    """ode-translate / ode-evaluate: what the user can fix is one line on stderr, exit code 2, the traceback kept in
    a file it names (ODE_TRACEBACK=1 re-raises); before, ode-translate printed the traceback and ode-evaluate
    exited 0 after its error line."""
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    missing = tmp_path / "missing" / "model"
    monkeypatch.setattr(
        sys, "argv", ["ode-translate", str(missing), "--input", str(write(tmp_path / "in.txt", "a\n"))]
    )
    assert refused(cli.translate) == (  # a refusal of the project's own: no traceback kept (issue 56 row 19)
        f"ode-translate: error: no model folder {missing}: give the folder ode_transformer.train.run wrote (its "
        "--output_dir) or a Hub id (USER/NAME)\n"
    )
    monkeypatch.setenv("ODE_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError, match="^no model folder"):
        cli.translate()
    monkeypatch.delenv("ODE_TRACEBACK")

    monkeypatch.setattr(sys, "argv", ["ode-evaluate", "--task", "gec", "--hyp", str(tmp_path / "none.txt")])
    assert refused(cli.evaluate).startswith("ode-evaluate: error: no such file")
    monkeypatch.setenv("ODE_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError, match="no such file"):
        cli.evaluate()
    monkeypatch.delenv("ODE_TRACEBACK")

    # ode-train names itself too (it used to print a bare "error:" and exit 1), in its usage line as well
    argv = ["--dataset", "multi30k", "--data_dir", str(tmp_path), "--output_dir", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", ["ode-train", *argv])
    last_line = refused(cli.train).splitlines()[-1]
    assert last_line.startswith("ode-train: error: shared corpus 'multi30k' not found")
    monkeypatch.setenv("ODE_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError, match="^shared corpus 'multi30k' not found"):
        cli.train()
    monkeypatch.delenv("ODE_TRACEBACK")
    monkeypatch.setattr(sys, "argv", ["ode-train", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        cli.train()
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("usage: ode-train [RECIPE]")
    assert (
        ode_transformer.train.arguments.build_parser().prog == "python -m ode_transformer.train.run"
    )  # outside the command, the module's name


@pytest.mark.both_cpus
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("learning_rate: [0.1]\n", "learning_rate: [0.1] is a list; give one value (`learning_rate: VALUE`)"),
        ("max_steps: 1.5\n", "max_steps: 1.5 is not a valid max_steps (it takes int)"),
        (
            "learning_rate: 0.1\nmax_steps 3\nwarmup_steps: 1\n",
            "is not valid YAML (could not find expected ':' at line 3, column 1)",
        ),
        ("- learning_rate\n", "holds a list, not a mapping of flags to values"),
    ],
    ids=["list for a number", "fraction for a count", "syntax error", "not a mapping"],
)
def test_a_bad_recipe_is_one_line_naming_it(tmp_path, capsys, monkeypatch, text, message, refused):
    """#44 rows 13 and 14: a raw TypeError (from inside transformers) and a yaml.scanner.ScannerError traceback."""
    recipe = write(tmp_path / "recipe.yaml", text)
    flags = [str(recipe), *TINY_RUN, "--output_dir", str(tmp_path / "out"), "--train_file", "a,b"]
    with pytest.raises(ValueError) as raised:
        parse_arguments(flags)
    assert str(raised.value).startswith(f"recipe {recipe}") and message in str(raised.value)
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    # python -m ode_transformer.train.run (ode-train: the same line)
    assert (
        refused(ode_transformer.train.run.main, flags).splitlines()[-1]
        == f"python -m ode_transformer.train.run: error: {raised.value}"
    )


def test_tracebacks_are_kept_only_for_unexpected_errors_and_do_not_pile_up(
    tmp_path, monkeypatch, capsys, refused
):
    """#56 row 19: every refusal, even "in use by another run", left a /tmp/ode-*.traceback file (50 in one round).
    A refusal raised by the project's own checks keeps none; an error from inside a library keeps one, and only
    the newest cli.KEPT_TRACEBACKS are kept."""
    import tempfile

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    for index in range(cli.KEPT_TRACEBACKS + 3):  # old ones, oldest first
        old = write(temporary / f"ode-translate-old{index}.traceback", "old")
        os.utime(old, (1_000_000 + index, 1_000_000 + index))
    missing = tmp_path / "missing"
    monkeypatch.setattr(
        sys, "argv", ["ode-translate", str(missing), "--input", str(write(tmp_path / "in", "a\n"))]
    )
    with pytest.raises(SystemExit):
        cli.translate()  # a refusal: no model folder
    assert capsys.readouterr().err.endswith("(USER/NAME)\n")
    assert len(list(temporary.iterdir())) == cli.KEPT_TRACEBACKS + 3  # nothing added, nothing pruned yet

    def library_failure():
        json.loads("{")  # raised inside the standard library: unexpected, worth a traceback

    monkeypatch.setattr(translate, "main", library_failure)
    kept = kept_traceback(refused(cli.translate), r"ode-translate: error: Expecting property name .*")
    assert "json.loads" in kept.read_text()
    left = sorted(p.name for p in temporary.iterdir())
    assert len(left) == cli.KEPT_TRACEBACKS and kept.name in left
    assert "ode-translate-old0.traceback" not in left and "ode-translate-old12.traceback" in left


def test_a_builtin_failing_on_a_project_line_is_unexpected_and_keeps_its_traceback():
    """A refusal is a `raise` of the project's own; a builtin failing on one of its lines (a KeyError, a zip of
    unequal lengths) is an unexpected error, whose traceback is kept."""
    from ode_transformer.train import data

    with pytest.raises(KeyError) as builtin:
        data._get_field({}, "missing")
    assert not cli.raised_by_own_check(builtin.value)
    with pytest.raises(ValueError) as own:
        data._file_pair("a,b,c")
    assert cli.raised_by_own_check(own.value)
