"""The console commands (ode_transformer/cli.py): what a user can fix ends in one line and exit code 2, checked
before any work; a traceback is kept only for an unexpected error, and they do not pile up. They start fast:
``--help`` and a refused flag are answered from the kept flags (``ode_transformer/parsers.json``), before torch and
transformers are imported, so that neither waits on loading them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
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
from ode_transformer import cli, parsers, translate
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
    """A --batch_size or --last below 1 (one batch of everything, every checkpoint averaged), a missing output
    folder (a failure after all the decoding) and an unknown device are refused before any work."""
    assert fragment in refused(main, [str(tmp_path / "model"), *flags])


@pytest.mark.both_cpus
def test_an_output_over_an_input_or_a_folder_is_refused_before_any_work(tmp_path, capsys, refused):
    """`--output` equal to `--input` (which would replace the source with hypotheses), ode-evaluate's
    `--output` equal to `--ref` (which would replace the reference with JSON) and an `--output` that is a
    folder are refused before any work, the files left as they were."""
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
    """ode-translate, ode-evaluate and ode-train: what the user can fix is one line on stderr naming the
    command and exit code 2, never a printed traceback nor exit code 0 after the error line; ODE_TRACEBACK=1
    re-raises the error instead."""
    monkeypatch.delenv("ODE_TRACEBACK", raising=False)
    missing = tmp_path / "missing" / "model"
    monkeypatch.setattr(
        sys, "argv", ["ode-translate", str(missing), "--input", str(write(tmp_path / "in.txt", "a\n"))]
    )
    assert refused(cli.translate) == (  # a refusal of the project's own: no traceback kept
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

    # ode-train names itself too, in its error line (not a bare "error:") and in its usage line
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
    """A recipe holding a list for a number, a fraction for a count, broken YAML or a list for a mapping is
    refused in one line naming the recipe and what is wrong, by parse_arguments and by the command alike,
    rather than by a TypeError from inside transformers or a YAML scanner's traceback."""
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
    """A refusal raised by the project's own checks (even "in use by another run") keeps no traceback file; an
    error from inside a library keeps one, and only the newest cli.KEPT_TRACEBACKS are kept, so that
    /tmp/ode-*.traceback files do not pile up."""
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
    # a refusal: no model folder
    assert refused(cli.translate).endswith("(USER/NAME)\n")
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
    from ode_transformer.train import file_readers, hub_datasets

    with pytest.raises(KeyError) as builtin:
        hub_datasets._get_field({}, "missing")
    assert not cli.raised_by_own_check(builtin.value)
    with pytest.raises(ValueError) as own:
        file_readers._file_pair("a,b,c")
    assert cli.raised_by_own_check(own.value)


# ----------------------------------------------------------------------------------------------------
# Fast answers: --help and refused flags from the kept parsers (ode_transformer/parsers.py)

REPO = Path(__file__).resolve().parents[1]
KEPT = json.loads(parsers.SNAPSHOT.read_text())
CURRENT = KEPT["transformers"] == parsers.transformers_version()


def _answer(parser, argv: list[str]) -> tuple[int, str, str]:
    """What `parser` does with `argv`: its exit code (0 where it parses), standard output and error."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
            code = 0
        except SystemExit as exit:
            code = exit.code
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("command", parsers.COMMANDS)
def test_kept_flags_are_the_live_parsers(command):
    """The kept parser's --help is the command's own, word for word, and it refuses and accepts as the command's
    does; with another transformers installed, the kept flags are not used. A changed parser:
    `python -m ode_transformer.parsers` rewrites the file."""
    if not CURRENT:
        same_minor = KEPT["transformers"].split(".")[:2] == parsers.transformers_version().split(".")[:2]
        assert (parsers.kept_parser(command) is None) is not same_minor
        pytest.skip(f"parsers.json was written with transformers {KEPT['transformers']}")
    live, kept = parsers.live_parser(command), parsers.kept_parser(command)
    assert kept.format_help() == live.format_help(), "run `python -m ode_transformer.parsers`"
    cases = {
        "ode-train": [
            ["--learning_rate", "fast"],
            ["--do_train", "maybe"],
            ["--no_such_flag", "1"],
            ["--eval_strategy", "sometimes"],
            ["--max_steps", "7", "--do_train", "false", "--eval_strategy", "steps"],
        ],
        "ode-translate": [[], ["M", "--batch_size", "0"], ["M", "--backend", "tpu"], ["M", "--bf16"]],
        "ode-evaluate": [["--task", "x", "--hyp", "h"], ["--task", "gec", "--hyp", "h", "--beta", "1"]],
        "ode-export": [["M"], ["M", "O", "--onnx", "--quantize", "int8"], ["M", "O", "--onnx-exporter", "x"]],
        "ode-model-card": [["M"], ["M", "m.json", "--repo-id", "u/n"]],
    }[command]
    for argv in cases:
        live_code, _, live_error = _answer(live, argv)
        assert (live_code, live_error) == _answer(kept, argv)[::2], argv


def test_another_patch_release_keeps_the_fast_help_and_leaves_refusals_to_the_command(monkeypatch, capsys):
    """With another patch release of the kept transformers version installed, `--help` is still answered from the
    kept flags, and a flag they refuse is left to the command's own parser (it may be one the release added);
    with the kept version, the kept flags refuse it; with another minor version, they answer nothing."""
    major, minor, *_ = KEPT["transformers"].split(".")
    answers = {}
    for installed in (KEPT["transformers"], f"{major}.{minor}.99", f"{major}.{int(minor) + 1}.0"):
        monkeypatch.setattr(parsers, "transformers_version", lambda installed=installed: installed)
        answers[installed] = []
        for argv in (["--help"], ["--no_such_flag", "1"], ["--max_steps", "3"]):
            try:
                parsers.check_arguments("ode-train", argv)
                code = None  # left to the command
            except SystemExit as exit:
                code = exit.code
            out, err = capsys.readouterr()
            answers[installed].append((code, "usage: ode-train" in out, bool(err)))
    left = (None, False, False)  # nothing said: the command's own parser answers
    assert answers == {
        KEPT["transformers"]: [(0, True, False), (2, False, True), left],
        f"{major}.{minor}.99": [(0, True, False), left, left],
        f"{major}.{int(minor) + 1}.0": [left, left, left],
    }


@pytest.mark.skipif(not CURRENT, reason="parsers.json was written with another transformers version")
def test_a_recipes_help_shows_its_values():
    """`ode-train RECIPE --help` shows the recipe's values as the defaults, as the command's own parser does."""
    from ode_transformer.train.recipe_files import RECIPES, read_recipe

    recipe = read_recipe(RECIPES / "multi30k_en_de_cpu.yaml")
    live = parsers.live_parser("ode-train")
    live.set_defaults(**recipe)
    kept = parsers.kept_parser("ode-train")
    assert parsers._apply_recipe(kept, ["multi30k_en_de_cpu", "--max_steps", "3"]) == ["--max_steps", "3"]
    assert kept.format_help() == live.format_help()
    assert "(default: 1500)" in " ".join(kept.format_help().split())


# The command, its arguments and the exit code it ends with, each answered before the command's module loads.
QUICK = [
    ("train", ["--help"], 0),
    ("train", ["multi30k_en_de_cpu", "--help"], 0),
    ("train", ["--list-recipes"], 0),
    ("train", ["--learning_rate", "fast"], 2),
    ("train", ["--no_such_flag", "1"], 2),
    ("translate", ["--help"], 0),
    ("translate", [], 2),
    ("export", ["--help"], 0),
    ("export", ["model", "out", "--onnx-exporter", "x"], 2),
    ("evaluate", ["--help"], 0),
    ("model_card", ["--help"], 0),
]
PROBE = """
import sys
from ode_transformer import cli
sys.argv = ["ode-{name}", *sys.argv[1:]]
try:
    getattr(cli, "{function}")()
except SystemExit as exit:
    code = exit.code
loaded = sorted(name for name in ("torch", "transformers", "datasets") if name in sys.modules)
print("PROBE", code, loaded, file=sys.stderr)
"""


@pytest.mark.skipif(not CURRENT, reason="parsers.json was written with another transformers version")
def test_help_and_refused_flags_need_neither_torch_nor_transformers():
    """Each command's --help and a flag it refuses end with argparse's exit code, and neither torch nor
    transformers (nor datasets) was imported."""
    for function, argv, code in QUICK:
        code_text = PROBE.format(name=function.replace("_", "-"), function=function)
        run = subprocess.run(
            [sys.executable, "-c", code_text, *argv], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        probe = run.stderr.strip().splitlines()[-1]
        assert probe == f"PROBE {code} []", (function, argv, run.stderr[-2000:])


@pytest.mark.skipif(not CURRENT, reason="parsers.json was written with another transformers version")
def test_help_starts_within_three_seconds():
    """The installed `ode-train --help`, timed, within the bound below (it took several times that when torch and
    transformers loaded first). Without them it needs a fraction of it, so a loaded machine does not make this
    flaky."""
    command = Path(sys.executable).with_name("ode-train")
    if not command.is_file():
        pytest.skip("no ode-train console command beside this interpreter (pip install -e .)")
    start = time.perf_counter()
    run = subprocess.run([str(command), "--help"], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - start
    assert run.returncode == 0 and "--label_smoothing_factor" in run.stdout
    assert elapsed < 3, f"ode-train --help took {elapsed:.1f} s"


PROXY_VARIABLES = [f"{name}_proxy" for name in ("http", "https", "all", "no")]
PROXY_VARIABLES += [name.upper() for name in PROXY_VARIABLES]


def test_an_unreachable_hub_sends_the_process_offline(monkeypatch):
    """One TCP connection to the Hub's host decides: refused, the process goes offline (HF_HUB_OFFLINE=1); a
    listening host, or HF_HUB_OFFLINE already set, leaves it as it is."""
    import socket

    from ode_transformer import cli

    monkeypatch.setenv(cli.HUB_UNREACHABLE_ENV, "")  # restored (unset) after the test, which sets it
    for variable in ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", cli.HUB_UNREACHABLE_ENV, *PROXY_VARIABLES]:
        monkeypatch.delenv(variable, raising=False)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        assert cli.go_offline_if_hub_unreachable() is False and "HF_HUB_OFFLINE" not in os.environ
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # closed now: refused
    assert cli.go_offline_if_hub_unreachable() is True and os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ[cli.HUB_UNREACHABLE_ENV] == "1"  # so that messages say the Hub cannot be reached
    assert cli.go_offline_if_hub_unreachable() is False  # already offline: no second check


def test_behind_a_proxy_the_hub_check_connects_to_the_proxy(monkeypatch):
    """With HTTPS_PROXY or ALL_PROXY set (either case), the first connection goes to the proxy's host and port, as
    the Hub client's requests would; a host NO_PROXY names is tried directly first. Refused there, the other route
    is tried, and only where both are refused does the process go offline (the Hub client may read NO_PROXY
    otherwise). A malformed proxy port leaves the direct route only. No network: the connection is a stand-in
    that records where it was asked to go."""
    import socket
    import urllib.request

    from ode_transformer import cli

    asked, refusing = [], set()

    def connect(address, timeout=None):
        asked.append(address)
        if address in refusing:
            raise ConnectionRefusedError(address)
        return socket.socket()  # unconnected, closed at once by the check

    monkeypatch.setattr(cli.socket, "create_connection", connect)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setenv(cli.HUB_UNREACHABLE_ENV, "")  # restored (unset) after the test, which sets it
    cases = [
        ({"HTTPS_PROXY": "http://proxy.example:3128"}, ("proxy.example", 3128)),
        ({"https_proxy": "proxy.example:8080"}, ("proxy.example", 8080)),  # no scheme: an HTTP proxy
        ({"ALL_PROXY": "socks5://socks.example"}, ("socks.example", 1080)),
        ({"all_proxy": "http://proxy.example"}, ("proxy.example", 80)),
        ({"HTTPS_PROXY": "http://proxy.example:3128", "NO_PROXY": "localhost,huggingface.co"},
         ("huggingface.co", 443)),
        ({"https_proxy": "http://proxy.example:3128", "no_proxy": "*"}, ("huggingface.co", 443)),
        ({}, ("huggingface.co", 443)),
        ({"HTTPS_PROXY": "http://proxy.example:notaport"}, ("huggingface.co", 443)),
    ]  # fmt: skip
    monkeypatch.setattr(
        urllib.request, "getproxies", urllib.request.getproxies_environment
    )  # no system proxy
    for variables, address in cases:
        for variable in [*PROXY_VARIABLES, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"]:
            monkeypatch.delenv(variable, raising=False)
        for variable, value in variables.items():
            monkeypatch.setenv(variable, value)
        asked.clear()
        refusing.clear()
        assert cli.go_offline_if_hub_unreachable() is False and asked == [address], (variables, asked)
        refusing.add(address)
        asked.clear()
        proxied = any(name.lower().endswith("_proxy") and name.lower() != "no_proxy" for name in variables)
        routes = 2 if proxied and "notaport" not in str(variables) else 1
        assert cli.go_offline_if_hub_unreachable() is (routes == 1), (variables, asked)
        assert len(asked) == routes and asked[0] == address, (variables, asked)
        refusing.update(asked)
        os.environ.pop("HF_HUB_OFFLINE", None)
        assert cli.go_offline_if_hub_unreachable() is True and os.environ["HF_HUB_OFFLINE"] == "1", variables


def test_offline_commands_end_in_a_few_lines(tmp_path):
    """Offline without HF_HUB_OFFLINE (the Hub refuses), a packaged recipe whose corpus has no local copy, one
    that names only a Hub dataset, and a Hub model id, each end with exit code 2 and one error line naming the way forward: under 5 lines in all,
    with no retry warnings before it."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env |= {"HF_ENDPOINT": f"http://127.0.0.1:{closed}", "HF_HOME": str(tmp_path / "hf"),
            "ODE_DATA_DIR": str(tmp_path / "no_data")}  # fmt: skip
    (tmp_path / "in.txt").write_text("a dog\n")
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "ode-train").is_file():
        pytest.skip("no console commands beside this interpreter (pip install -e .)")
    runs = {
        "--data_dir": [bin_dir / "ode-train", "multi30k_en_de_cpu", "--output_dir", tmp_path / "out"],
        # a recipe that names only a Hub dataset: its offline error names local files instead
        "--train_file": [bin_dir / "ode-train", "wmt14_en_de_base", "--output_dir", tmp_path / "wmt14"],
        "HF_HUB_OFFLINE=1": [bin_dir / "ode-translate", "someuser/model", "--input", tmp_path / "in.txt"],
    }
    for way_forward, command in runs.items():
        run = subprocess.run(
            list(map(str, command)), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        lines = (run.stdout + run.stderr).splitlines()
        assert run.returncode == 2 and len(lines) < 5, lines
        assert lines[-1].startswith(f"{command[0].name}: error: ") and way_forward in lines[-1], lines[-1]
