"""The console commands start fast: ``--help`` and a refused flag are answered from the kept flags
(``ode_transformer/parsers.json``), before torch and transformers are imported (issue 64: ``ode-train --help`` took
15 s)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ode_transformer import parsers

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
        assert parsers.kept_parser(command) is None
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
    """The installed `ode-train --help`, timed: under 3 s (it took 15 s when torch and transformers loaded
    first). Without them it needs a fraction of a second, so a loaded machine does not make this flaky."""
    command = Path(sys.executable).with_name("ode-train")
    if not command.is_file():
        pytest.skip("no ode-train console command beside this interpreter (pip install -e .)")
    start = time.perf_counter()
    run = subprocess.run([str(command), "--help"], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - start
    assert run.returncode == 0 and "--label_smoothing_factor" in run.stdout
    assert elapsed < 3, f"ode-train --help took {elapsed:.1f} s"


def test_an_unreachable_hub_sends_the_process_offline(monkeypatch):
    """One TCP connection to the Hub's host decides: refused, the process goes offline (HF_HUB_OFFLINE=1); a
    listening host, or HF_HUB_OFFLINE already set, leaves it as it is."""
    import socket

    from ode_transformer import cli

    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        assert cli.go_offline_if_hub_unreachable() is False and "HF_HUB_OFFLINE" not in os.environ
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")  # closed now: refused
    assert cli.go_offline_if_hub_unreachable() is True and os.environ["HF_HUB_OFFLINE"] == "1"
    assert cli.go_offline_if_hub_unreachable() is False  # already offline: no second check


def test_offline_commands_end_in_a_few_lines(tmp_path):
    """Offline without HF_HUB_OFFLINE (the Hub refuses), a packaged recipe whose corpus has no local copy, and a
    Hub model id, each end with one error line naming the way forward: under 5 lines in all (issue 64: about 20
    retry warnings over 24 s, and 25 lines over 57 s)."""
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
        "go online": [bin_dir / "ode-translate", "someuser/model", "--input", tmp_path / "in.txt"],
    }
    for way_forward, command in runs.items():
        run = subprocess.run(
            list(map(str, command)), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        lines = (run.stdout + run.stderr).splitlines()
        assert run.returncode == 2 and len(lines) < 5, lines
        assert lines[-1].startswith(f"{command[0].name}: error: ") and way_forward in lines[-1], lines[-1]
