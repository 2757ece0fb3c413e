"""The console commands' ``--help`` and argument errors without torch or transformers.

``ode-train``'s parser is transformers' ``HfArgumentParser`` over ``Seq2SeqTrainingArguments``, and
``ode-translate``'s and ``ode-export``'s modules import torch: building the parser alone costs seconds. So each
command's flags (names, types, choices, defaults, help, groups) are kept in ``parsers.json`` beside this module,
written from the live parsers by ``python -m ode_transformer.parsers``; :func:`check_arguments` rebuilds a
command's parser from it with argparse alone, and answers ``--help``, ``--list-recipes`` and a flag it refuses
(unknown, a bad number, a choice not offered) before anything heavy is imported. Arguments it accepts go on to
the command, which parses them again with its own parser and makes its checks. The argument types the kept flags
convert with live here too (``positive_int``, which ``ode_transformer.cli`` hands on to every command's module), so
that this module imports nothing of the project: the recipes of ``ode-train RECIPE --help`` are read through
``importlib``, as the console commands reach the tools.

The file holds the flags of one transformers version. transformers adds and changes ``TrainingArguments`` fields in
its minor releases (a patch release fixes bugs), so another patch release of the same minor version uses the file
too, except that a flag the kept parser refuses is left to the command's own parser, which judges it (slowly): only
the version the file was written with has its refusals answered from it. With another minor version installed it is
not used. tests/test_cli.py checks it is the live parsers': a parser changed without
``python -m ode_transformer.parsers`` fails it.

argparse has no public description of its actions and groups: this module reads and rebuilds its private ones
(the action classes, ``_actions``, ``_action_groups``, ``_group_actions``), as ``modeling_ode.compat`` does for the
parsers themselves; it cannot import compat, which imports torch. Checked: Python 3.11.7.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).with_name("parsers.json")
COMMANDS: dict[str, tuple[str, str]] = {
    "ode-train": ("ode_transformer.train.arguments", "build_parser"),
    "ode-translate": ("ode_transformer.translate", "build_parser"),
    "ode-evaluate": ("ode_transformer.train.evaluate_predictions", "build_parser"),
    "ode-export": ("ode_transformer.hub.export", "build_parser"),
    "ode-model-card": ("ode_transformer.hub.model_card", "build_parser"),
}
"""The commands whose parsers are kept: console command -> (module, function returning its parser)."""

_ACTIONS = {
    argparse._StoreAction: "store",
    argparse._StoreConstAction: "store_const",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._AppendAction: "append",
    argparse._HelpAction: "help",
}
# What each kind of action takes besides its flags, dest, help and default.
_ACTION_FIELDS = {
    "store": ("nargs", "const", "type", "choices", "required", "metavar"),
    "append": ("nargs", "const", "type", "choices", "required", "metavar"),
    "store_const": ("const", "required", "metavar"),
    "store_true": ("required",),
    "store_false": ("required",),
    "help": (),
}
_PLAIN = (type(None), bool, int, float, str)


def transformers_version() -> str | None:
    """The installed transformers' version, read from its metadata (importing it is what this module avoids)."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def string_to_bool(value: str | bool) -> bool:
    """transformers' ``HfArgumentParser`` type of a boolean flag, with its words and its error."""
    if isinstance(value, bool):
        return value
    if value.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if value.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {value} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)."
    )


def positive_int(text: str) -> int:
    """An argparse ``type`` for a count (batch size, beams, checkpoints): 0 or less is refused by name, where it
    would otherwise mean "everything" or nothing at all."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


# The types a kept flag converts with, by name; any other (an enum's choice, a path) takes the text as it is,
# and the command's own parser judges it.
_TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "string_to_bool": string_to_bool,
    "positive_int": positive_int,
}


class _Shown:
    """A default that is not plain data (an enum, a path): argparse only shows it, as its text."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text


def _default(value: Any) -> Any:
    if isinstance(value, list) and all(type(item) in _PLAIN for item in value):
        return value
    if type(value) in _PLAIN or value is argparse.SUPPRESS:
        return value
    return {"shown": str(value)}


def describe(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """`parser` as data: its words, its groups in the order `--help` lists them, and its actions in the order
    they were added (which the generated usage line follows), each with the index of its group."""
    groups = parser._action_groups
    actions = []
    for action in parser._actions:
        kind = _ACTIONS[type(action)]
        group = next(i for i, g in enumerate(groups) if action in g._group_actions)
        entry = {
            "kind": kind,
            "group": group,
            "flags": list(action.option_strings),
            "dest": action.dest,
            "help": action.help,
            "default": _default(action.default),
        }
        for name in _ACTION_FIELDS[kind]:
            value = getattr(action, name)
            if name == "type":
                value = getattr(value, "__name__", None) if value is not None else None
            elif name == "choices" and value is not None:
                value = [str(choice) for choice in value]
            elif name == "metavar" and isinstance(value, tuple):
                value = list(value)
            elif name == "const":
                value = _default(value)
            entry[name] = value
        actions.append(entry)
    return {
        "usage": parser.usage,
        "description": parser.description,
        "epilog": parser.epilog,
        "formatter_class": parser.formatter_class.__name__,
        "groups": [{"title": g.title, "description": g.description} for g in groups],
        "actions": actions,
    }


def _value(value: Any) -> Any:
    return _Shown(value["shown"]) if isinstance(value, dict) else value


def rebuild(spec: dict[str, Any], prog: str) -> argparse.ArgumentParser:
    """An argparse parser with the flags, words and `--help` of the parser `spec` describes."""
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=spec["usage"],
        description=spec["description"],
        epilog=spec["epilog"],
        formatter_class=getattr(argparse, spec["formatter_class"]),
        add_help=False,
    )
    parser._action_groups = []  # the kept groups replace argparse's two, in their order
    groups = [parser.add_argument_group(g["title"], g["description"]) for g in spec["groups"]]
    for entry in spec["actions"]:
        options = {"help": entry["help"], "default": _value(entry["default"])}
        for name in _ACTION_FIELDS[entry["kind"]]:
            value = entry[name]
            if name == "type":
                value = _TYPES.get(value) if value is not None else None
            elif name == "metavar" and isinstance(value, list):
                value = tuple(value)
            elif name == "const":
                value = _value(value)
            options[name] = value
        if entry["kind"] == "help":
            options.pop("default")
        if entry["flags"]:
            groups[entry["group"]].add_argument(
                *entry["flags"], action=entry["kind"], dest=entry["dest"], **options
            )
        else:
            options.pop("required", None)  # a positional's is implied by its nargs
            groups[entry["group"]].add_argument(entry["dest"], action=entry["kind"], **options)
    return parser


def live_parser(command: str) -> argparse.ArgumentParser:
    """The command's own parser, as its console command builds it (imports torch and transformers), under the
    command's name."""
    module, function = COMMANDS[command]
    parser = getattr(importlib.import_module(module), function)()
    parser.prog = command
    return parser


def write_snapshot(path: Path = SNAPSHOT) -> None:
    """Keep every command's live parser in `path` (``python -m ode_transformer.parsers``)."""
    data = {
        "transformers": transformers_version(),
        "commands": {command: describe(live_parser(command)) for command in COMMANDS},
    }
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _minor_version(version: str | None) -> list[str] | None:
    """``5.24`` of ``5.24.1``: the part of a version a release changes ``TrainingArguments`` in."""
    return None if version is None else version.split(".")[:2]


def _kept(command: str) -> tuple[argparse.ArgumentParser | None, bool]:
    """The command's parser rebuilt from the kept flags (None where none are kept for it, or they were written with
    another minor version of transformers than the one installed), and whether they were written with the very
    version installed."""
    if command not in COMMANDS:
        return None, False
    try:
        data = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, False
    kept, installed = data.get("transformers"), transformers_version()
    if installed is None or _minor_version(kept) != _minor_version(installed):
        return None, False
    if command not in data.get("commands", {}):
        return None, False
    return rebuild(data["commands"][command], command), kept == installed


def kept_parser(command: str) -> argparse.ArgumentParser | None:
    """The command's parser rebuilt from the kept flags; None where none are kept for it, or they were written
    with another minor version of transformers than the one installed."""
    return _kept(command)[0]


class _Refused(Exception):
    """A kept parser refused the arguments, where the command's own parser is the judge."""


def _refuse(message: str) -> None:
    raise _Refused(message)


def _recipe_files():
    """``ode_transformer.train.recipe_files`` (PyYAML and the standard library): reached by name, as the console
    commands reach the tools, since the shared ground imports nothing of them."""
    return importlib.import_module("ode_transformer.train.recipe_files")


def _apply_recipe(parser: argparse.ArgumentParser, argv: list[str]) -> list[str] | None:
    """``ode-train RECIPE ...``: the recipe's values as the defaults (as ``parse_arguments`` does) and the flags
    after it; None where the recipe cannot be read, or names a key that is no flag: the command says why."""
    recipes = _recipe_files()
    try:
        recipe = recipes.read_recipe(recipes.find_recipe(argv[0]))
    except (recipes.RecipeError, OSError):
        return None
    if not set(recipe) <= {action.dest for action in parser._actions}:
        return None
    parser.set_defaults(**recipe)
    return argv[1:]


def check_arguments(command: str, argv: list[str]) -> None:
    """Answer ``--help`` (exit 0) and refuse what the command's parser refuses (one line, exit 2) from the kept
    flags, before the command's module is imported; return where the arguments parse, or no flags are kept, or the
    kept flags were written with another patch release of transformers and refuse them."""
    parser, exact = _kept(command)
    if parser is None:
        return
    if not exact:  # another patch release: a flag refused here may be one it added, so its own parser judges
        parser.error = _refuse
    if command == "ode-train":
        if {"--list-recipes", "--list_recipes"} & set(argv):
            _recipe_files().list_recipes()
            raise SystemExit(0)
        if argv and not argv[0].startswith("-"):
            argv = _apply_recipe(parser, argv)
            if argv is None:
                return
    try:
        parser.parse_args(argv)
    except _Refused:
        return


if __name__ == "__main__":
    write_snapshot()
    print(SNAPSHOT, file=sys.stderr)
