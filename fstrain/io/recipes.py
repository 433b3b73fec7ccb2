"""Reading recipes from disk: the shipped ones (``fstrain/recipes/*.yaml``) and the user's own.

The validation is pure (:func:`fstrain.core.recipe.parse_recipe`); this module only finds the
file, reads it and parses YAML with ``yaml.safe_load``, turning every failure into one
:class:`~fstrain.errors.InputError` that names the file (and the line, for YAML syntax).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fstrain.core.recipe import Recipe, parse_recipe
from fstrain.errors import InputError


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
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the recipe: {exc}", "", path) from None
    stem = file.name[: -len(".yaml")] if file.name.endswith(".yaml") else file.stem
    return _parse_text(text, path, stem)


def _parse_text(text: str, where: str, default_name: str) -> Recipe:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        location = f"{where}:{mark.line + 1}" if mark is not None else where
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise InputError(f"not valid YAML: {problem}", "fix the YAML syntax", location) from None
    return parse_recipe(data, where, default_name)
