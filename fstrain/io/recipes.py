"""Reading recipes from disk: the shipped ones (``fstrain/recipes/*.yaml``) and the user's own.

The validation is pure (:func:`fstrain.core.recipe.parse_recipe`); this module only finds the
file, reads it (bounded) and parses YAML with :func:`fstrain.io.userfiles.load_yaml`, turning every failure into one
:class:`~fstrain.errors.InputError` that names the file (and the line, for YAML syntax).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fstrain.core.recipe import Recipe, parse_recipe
from fstrain.errors import InputError
from fstrain.io.userfiles import load_yaml, read_text_bounded


def shipped_recipe_names() -> list[str]:
    """Names accepted by ``--model``, sorted."""
    folder = resources.files("fstrain") / "recipes"
    return sorted(entry.name[: -len(".yaml")] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def load_shipped_recipe(name: str) -> Recipe:
    """The recipe ``fstrain/recipes/<name>.yaml`` (what ``--model NAME`` means)."""
    names = shipped_recipe_names()
    if name not in names:
        raise InputError(
            f"unknown model {name!r}",
            f"known models: {', '.join(names)}; or give your own file with --recipe PATH",
            "--model",
        )
    text = (resources.files("fstrain") / "recipes" / f"{name}.yaml").read_text(encoding="utf-8")
    return _parse_text(text, f"recipes/{name}.yaml", name)


def load_recipe_file(path: str) -> Recipe:
    """A user's recipe file (what ``--recipe PATH`` means)."""
    file = Path(path)
    if not file.is_file():
        raise InputError("recipe file not found", "check the path given to --recipe", path)
    text = read_text_bounded(file, "recipe", hint="check the path given to --recipe")
    stem = file.name[: -len(".yaml")] if file.name.endswith(".yaml") else file.stem
    return _parse_text(text, path, stem)


def _parse_text(text: str, where: str, default_name: str) -> Recipe:
    return parse_recipe(load_yaml(text, where), where, default_name)
