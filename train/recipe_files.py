"""Recipes: YAML/JSON files of flag defaults for a run (``ode-train RECIPE --flag value``), packaged in
``train/recipes/`` or given as a path. Found and read here with the standard library and PyYAML alone, so that
``ode-train RECIPE --help`` answers before torch and transformers are imported (``ode_transformer.parsers``); the
check of a recipe's values against the flags is ``ode_transformer.train.arguments``'.
"""

from __future__ import annotations

from pathlib import Path

import yaml

RECIPES = Path(__file__).resolve().parent / "recipes"  # packaged with the install


class RecipeNotFoundError(FileNotFoundError):
    """RECIPE is neither a file nor a packaged recipe."""


class RecipeError(ValueError):
    """RECIPE is not a mapping of flags to values of their types (a YAML error, an unknown key, a list for a number)."""


def recipe_names() -> list[str]:
    """The packaged recipes (``train/recipes/*.yaml``), by name."""
    return sorted(path.stem for path in RECIPES.glob("*.yaml"))


def find_recipe(name: str) -> Path:
    """A recipe file: ``name`` if it is a file, else the packaged recipe of that name (``.yaml`` optional)."""
    path = Path(name)
    if path.is_file():
        return path
    packaged = RECIPES / (name if path.suffix in (".yaml", ".yml", ".json") else f"{name}.yaml")
    if path.parent == Path(".") and packaged.is_file():
        return packaged
    raise RecipeNotFoundError(
        f"no recipe {name!r}: give a YAML/JSON file or a packaged recipe ({', '.join(recipe_names())})"
    )


def list_recipes() -> None:
    for name in recipe_names():
        print(f"{name:<24} {RECIPES / f'{name}.yaml'}")


def read_recipe(path: Path) -> dict:
    """A recipe's flags and values; YAML (or JSON) that does not parse, or is not a mapping, is refused by name.

    Raises:
        RecipeError: the file, where it stops parsing, and the fix.
    """
    try:
        recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise RecipeError(
            f"recipe {path} is not valid YAML ({problem}{where}); fix it: one `flag: value` per line, e.g. "
            "`learning_rate: 0.0005`"
        ) from None
    if recipe is None:
        return {}
    if not isinstance(recipe, dict):
        raise RecipeError(
            f"recipe {path} holds a {type(recipe).__name__}, not a mapping of flags to values: write one "
            "`flag: value` per line, e.g. `learning_rate: 0.0005`"
        )
    return recipe
